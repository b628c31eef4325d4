"""Migrations run both ways on real Postgres and agree with the ORM models."""

from __future__ import annotations

import uuid

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, make_url

from models import Base
from service.migrate import downgrade, upgrade
from tests.conftest import SERVER_URL, _admin_conninfo


def test_upgrade_downgrade_upgrade_and_no_pending_diff() -> None:
    name = f"parity_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        upgrade(url)
        assert "runs" in inspect(engine).get_table_names()
        downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(url)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
    finally:
        engine.dispose()
        with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
