"""A throw-away, empty database on the test server, for tests that run migrations themselves."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
from sqlalchemy import Engine, create_engine, make_url

from tests.plugins.database import SERVER_URL, _admin_conninfo


@contextlib.contextmanager
def scratch_database() -> Iterator[tuple[str, Engine]]:
    """(url, engine) of a new empty database, dropped (with its connections) afterwards."""
    name = f"parity_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        yield url, engine
    finally:
        engine.dispose()
        with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
