"""The database fixtures: a fresh, migrated database on the real Postgres server for each test session.

PARITY_TEST_DATABASE_URL (default: the local server on 127.0.0.1:5432) names the server; each pytest
session (each xdist worker) creates its own database there, runs `alembic upgrade head`, and drops it at
the end. A pytest plugin (tests/conftest.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.orm import Session

from models import Base
from service.core.db import reset_engine, upgrade
from service.core.settings import get_settings

SERVER_URL = os.environ.get(
    "PARITY_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _admin_conninfo() -> str:
    return make_url(SERVER_URL).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A new database for this test session, migrated to head."""
    name = f"parity_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    reset_engine()
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings_env(database_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point the service's settings at the test database and a temporary run folder."""
    monkeypatch.setenv("PARITY_DATABASE_URL", database_url)
    monkeypatch.setenv("PARITY_RUN_FOLDER", str(tmp_path / "runs"))
    monkeypatch.setenv("PARITY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PARITY_PUBLIC_URL", "http://testserver")
    get_settings.cache_clear()
    reset_engine()
    yield
    get_settings.cache_clear()
    reset_engine()


@pytest.fixture
def db_session(database_url: str, settings_env: None) -> Iterator[Session]:
    """A session inside an outer transaction that is rolled back after the test."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        outer = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
        try:
            yield session
        finally:
            session.close()
            outer.rollback()
    engine.dispose()


@pytest.fixture
def committed_db(database_url: str, settings_env: None) -> Iterator[str]:
    """For tests whose work spans processes (scheduler, API server): real commits, emptied afterwards."""
    yield database_url
    engine = create_engine(database_url)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture
def client(db_session: Session):
    """A TestClient whose requests share the test's rolled-back transaction."""
    from fastapi.testclient import TestClient

    from service.core.deps import get_session
    from service.web.app import create_app

    app = create_app()

    def _session() -> Iterator[Session]:
        yield db_session
        db_session.flush()

    app.dependency_overrides[get_session] = _session
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def make_token(db_session: Session):
    """Create a token with the given scopes (and tracks: any unless given) and return its Authorization header."""
    from service.core.tokens import create_token

    def _make(*scopes: str, name: str = "tester", tracks: tuple[str, ...] = ("*",)) -> dict[str, str]:
        secret = create_token(db_session, name=name, scopes=list(scopes), tracks=list(tracks))
        return {"Authorization": f"Bearer {secret}"}

    return _make
