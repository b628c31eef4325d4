"""Migrations run both ways on real Postgres and agree with the ORM models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from models import Base
from service.core.db import downgrade, upgrade
from tests.plugins.scratch import scratch_database


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


def test_migration_files_sort_in_their_chain_order() -> None:
    import re
    from pathlib import Path

    versions = Path(__file__).resolve().parents[2] / "alembic" / "versions"
    down: dict[str, str | None] = {}
    files: dict[str, str] = {}
    for path in versions.glob("*.py"):
        text = path.read_text()
        rev = re.search(r"^revision = '(\w+)'", text, re.M)
        prev = re.search(r"^down_revision = (?:'(\w+)'|None)", text, re.M)
        assert rev and prev, path.name
        down[rev.group(1)], files[rev.group(1)] = prev.group(1), path.name
    chain: list[str] = []
    head: str | None = next(r for r in down if r not in set(down.values()))
    while head is not None:
        chain.append(head)
        head = down[head]
    chain.reverse()
    assert sorted(files.values()) == [files[r] for r in chain]
    assert all(re.match(rf"\d\d_rev{r}_", files[r]) for r in chain)


def test_tokens_made_before_track_patterns_may_write_every_track() -> None:
    """0016 gives every existing token the pattern '*': nothing that worked before is refused."""
    from sqlalchemy import text

    with scratch_database() as (url, engine):
        upgrade(url, "0015")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO api_tokens (name, token_hash, scopes, created_at) "
                              "VALUES ('ci', repeat('a', 64), '[\"submit\"]', now())"))
        upgrade(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT tracks FROM api_tokens")).scalar_one() == ["*"]
