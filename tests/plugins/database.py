"""The database fixtures: every test that touches the database gets its own, on the real Postgres server.

PARITY_TEST_DATABASE_URL (default: the local server on 127.0.0.1:5432) names the server. Each pytest
session (each xdist worker) migrates one template database once (`alembic upgrade head`); every test
that uses `settings_env` (and so `db_session`, `committed_db`, `client`, `live_api`) gets a clone of it
(`CREATE DATABASE ... TEMPLATE`, ~0.1 s) and the service's settings point at the clone. Tests therefore
go through the service's own session path (`service.core.db.new_session`, `deps.get_session`): there is
no outer transaction to roll back and no dependency override, so nothing in service/ has to know about
tests. The clone is dropped after its test, on a background thread. `database_url` is the session's own
clone, for package-wide seeds (tests/dashboard). A pytest plugin (tests/conftest.py)."""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url
from sqlalchemy.orm import Session

from service.core.db import new_session, reset_engine, upgrade
from service.core.settings import get_settings

SERVER_URL = os.environ.get(
    "PARITY_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _admin_conninfo() -> str:
    return make_url(SERVER_URL).set(drivername="postgresql").render_as_string(hide_password=False)


def _url_of(name: str) -> str:
    return make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)


def _admin(sql: str) -> None:
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(sql)


class _Dropper:
    """Drops the databases tests are done with, one at a time on a thread: a test does not wait for it."""

    def __init__(self) -> None:
        self.names: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="drop-test-databases")
        self.thread.start()

    def _run(self) -> None:
        while (name := self.names.get()) is not None:
            _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        self.names.put(None)
        self.thread.join()


@pytest.fixture(scope="session")
def template_database() -> Iterator[str]:
    """The name of this session's migrated template database (nothing stays connected to it: clones need that)."""
    name = f"parity_tpl_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}"')
    upgrade(_url_of(name))
    reset_engine()
    yield name
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def _dropper() -> Iterator[_Dropper]:
    dropper = _Dropper()
    yield dropper
    dropper.close()


def clone(template: str) -> str:
    """A new database copied from template; -> its name."""
    name = f"parity_test_{uuid.uuid4().hex[:10]}"
    # WAL_LOG (the default since Postgres 15) copies block by block without a checkpoint: ~0.1 s here,
    # against ~1 s for FILE_COPY
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY WAL_LOG')
    return name


@pytest.fixture(scope="session")
def database_url(template_database: str, _dropper: _Dropper) -> Iterator[str]:
    """This session's own migrated database (for package-wide seeds); each test's own is `committed_db`."""
    name = clone(template_database)
    yield _url_of(name)
    reset_engine()
    _dropper.names.put(name)


@pytest.fixture
def test_database_url(template_database: str, _dropper: _Dropper) -> Iterator[str]:
    """A migrated database of this test's own, dropped after it."""
    name = clone(template_database)
    yield _url_of(name)
    reset_engine()  # the service's pooled connections to it go first
    _dropper.names.put(name)


@pytest.fixture
def settings_env(test_database_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point the service's settings at this test's database and a temporary run folder."""
    monkeypatch.setenv("PARITY_DATABASE_URL", test_database_url)
    monkeypatch.setenv("PARITY_RUN_FOLDER", str(tmp_path / "runs"))
    monkeypatch.setenv("PARITY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PARITY_PUBLIC_URL", "http://testserver")
    get_settings.cache_clear()
    reset_engine()
    yield
    get_settings.cache_clear()
    reset_engine()


@pytest.fixture
def db_session(settings_env: None) -> Iterator[Session]:
    """A session of the service's own (`new_session`) on this test's database; what it holds is
    committed before each request of `client`, so the request's own session sees it."""
    session = new_session()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


@pytest.fixture
def committed_db(test_database_url: str, settings_env: None) -> str:
    """For tests whose work spans processes (scheduler, API server): this test's database URL."""
    return test_database_url


def _committing_client(session: Session) -> Any:
    from fastapi.testclient import TestClient

    class CommittingClient(TestClient):
        """A TestClient that commits the test's session before each request and forgets what it loaded
        after: the request runs on its own session and transaction, as in production."""

        def request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            session.commit()
            try:
                return super().request(*args, **kwargs)
            finally:
                session.expire_all()

    return CommittingClient


@pytest.fixture
def client(db_session: Session):
    """A TestClient on the real app and this test's database (no override: the app's own sessions)."""
    from service.web.app import create_app

    with _committing_client(db_session)(create_app()) as test_client:
        yield test_client


@pytest.fixture
def make_token(db_session: Session):
    """Create a token with the given scopes (and tracks: any unless given) and return its Authorization header."""
    from service.core.tokens import create_token

    def _make(*scopes: str, name: str = "tester", tracks: tuple[str, ...] = ("*",)) -> dict[str, str]:
        secret = create_token(db_session, name=name, scopes=list(scopes), tracks=list(tracks))
        return {"Authorization": f"Bearer {secret}"}

    return _make
