"""Migrations run both ways on real Postgres and agree with the ORM models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from models import Base
from service.core.migrate import downgrade, upgrade
from tests.models.scratch import scratch_database


def test_upgrade_downgrade_upgrade_and_no_pending_diff() -> None:
    with scratch_database() as (url, engine):
        upgrade(url)
        assert "runs" in inspect(engine).get_table_names()
        downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(url)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
