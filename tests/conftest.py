"""Test fixtures: a fresh, migrated database on the real Postgres server for each test session.

PARITY_TEST_DATABASE_URL (default: the local server on 127.0.0.1:5432) names the server; each
pytest session creates its own database there, runs `alembic upgrade head`, and drops it at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.orm import Session

from models import Base
from service.core.db import reset_engine
from service.core.migrate import upgrade
from service.core.settings import get_settings
from tests.run_local import LocalReference

# The periodic detector-health batch would queue Megatron runs behind every scheduler test;
# tests that exercise it turn it on themselves.
os.environ.setdefault("PARITY_SELFTEST_INTERVAL_HOURS", "0")
# Test receivers listen on 127.0.0.1; tests/security/test_notify_destinations.py turns this off to
# show internal addresses refused by default.
os.environ.setdefault("PARITY_NOTIFY_ALLOW_PRIVATE", "1")

# Fixtures that reach the Postgres server: a test using any of them is marked `postgres`
# (`pytest -m "not postgres"` runs what needs nothing at all).
POSTGRES_FIXTURES = frozenset({"database_url", "settings_env", "db_session", "committed_db", "client"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the database as `postgres`; leave out `nightly` unless -m names it."""
    for item in items:
        if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
    # The nightly tests repeat, at more cost, what a CI test already covers (each names its CI slice):
    # `-m nightly` (scripts/test.sh --nightly) runs them, any other run leaves them out.
    if "nightly" not in (config.getoption("markexpr") or ""):
        nightly = [item for item in items if item.get_closest_marker("nightly")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("nightly")]


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


def slurm_unavailable_reason() -> str | None:
    """Why the real single-node Slurm cannot be used, or None when a node answers."""
    if not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
        return "SLURM_CONF unset or sbatch missing: run scripts/slurm-up.sh and source its env.sh"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    if out.returncode != 0 or not any(s.strip("*~#") in {"idle", "mix", "alloc", "comp"} for s in out.stdout.split()):
        return f"no usable Slurm node: {(out.stdout + out.stderr).strip()}"
    return None


@pytest.fixture(scope="session")
def slurm() -> str:
    """SLURM_CONF of a live Slurm; skips without one, fails instead when PARITY_REQUIRE_SLURM=1 (CI)."""
    reason = slurm_unavailable_reason()
    if reason:
        if os.environ.get("PARITY_REQUIRE_SLURM") == "1":
            pytest.fail(f"Slurm is required here: {reason}")
        pytest.skip(reason)
    return os.environ["SLURM_CONF"]


@pytest.fixture(scope="session")
def run_local_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Any]], LocalReference]:
    """run-local of a spec, once per session: tests/jobs' known-good DP 2 and reshard runs are the
    references tests/service/test_protocol_equality.py compares the scheduler's runs with, and the
    warm-pool walk its warm run (the same specs: run-local runs each once for all of them)."""
    import json

    from jobs.launch.local import run_parity
    from jobs.spec import RunSpec

    done: dict[str, LocalReference] = {}

    def reference(fields: dict[str, Any]) -> LocalReference:
        spec = RunSpec.from_dict(fields)
        key = json.dumps(spec.to_dict(), sort_keys=True)
        if key not in done:
            folder = tmp_path_factory.mktemp("run-local")
            done[key] = LocalReference(run_parity(spec, folder), folder)
        return done[key]

    return reference
