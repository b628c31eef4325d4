"""Migration 0014's history_summary backfill, for the benchmarks' bulk seeds.

The seeds insert runs with triggers off (the per-row summary trigger made a 1M-run INSERT take over
half an hour), then build the summary in one statement: the migration's own, read from it, so a
change to the summary's shape reaches every seed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

MIGRATION = Path(__file__).resolve().parents[1] / "alembic" / "versions" / "10_rev0014_history_summary_run_indexes.py"


def backfill_sql() -> str:
    """The INSERT … SELECT that rebuilds history_summary from runs (no trailing semicolon)."""
    spec = importlib.util.spec_from_file_location("parity_rev0014_history_summary", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.BACKFILL).strip().rstrip(";")
