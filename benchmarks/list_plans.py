"""EXPLAIN ANALYZE of every run-list query (GET /api/v1/runs and the dashboard's /runs filters).

    .venv/bin/python benchmarks/list_plans.py --database NAME [--short]

Runs each filter of service/runs/records.py (the first page, 50 rows, newest first) on an existing
database (e.g. the one `api_load.py --database NAME` seeded with 1M runs), captures the statement
exactly as SQLAlchemy sends it, and prints Postgres's plan with timing and buffers: which index
each filter uses. --short prints one line per query (the plan's top node, the index used, time).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, make_url
from sqlalchemy.orm import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def filters() -> dict[str, Any]:
    from service.runs.records import RunFilter

    week = datetime.now(UTC) - timedelta(days=7)
    return {
        "no filter": RunFilter(),
        "dashboard default (no self-tests)": RunFilter(selftest=False),
        "self-tests only": RunFilter(selftest=True),
        "config": RunFilter(config="dense-bf16"),
        "check": RunFilter(check="c4ca4238a0b92382"),
        "track (rare)": RunFilter(track="release-9"),
        "track (common)": RunFilter(track="main"),
        "environment": RunFilter(environment="default"),
        "state=queued": RunFilter(state="queued"),
        "verdict=fail": RunFilter(verdict="fail"),
        "verdict=error (rare)": RunFilter(verdict="error"),
        "regression": RunFilter(regression=True),
        "label commit (one run)": RunFilter(labels={"commit": "c4ca4238a0b923820dcc509a6f75849b"}),
        "label branch (common)": RunFilter(labels={"branch": "main"}),
        "since a week ago": RunFilter(since=week),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", required=True)
    ap.add_argument("--short", action="store_true")
    args = ap.parse_args()
    from service.runs.records import list_runs

    url = make_url(SERVER).set(database=args.database, drivername="postgresql+psycopg")
    engine = create_engine(url)
    sent: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _capture(_conn, _cursor, statement, parameters, _context, _many):  # type: ignore[no-untyped-def]
        sent.append((statement, parameters))

    with Session(engine) as session:
        for name, wanted in filters().items():
            sent.clear()
            list_runs(session, filters=wanted, limit=50, offset=0)
            statement, parameters = sent[0]  # the runs query (the environments' selectinload follows)
            raw = session.connection().connection.driver_connection
            assert raw is not None
            with raw.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
                plan = [row[0] for row in cursor.fetchall()]
            if args.short:
                used = sorted(set(re.findall(r"(?:Index|Index Only|Bitmap Index) Scan (?:Backward )?(?:using|on) (\w+)",
                                             "\n".join(plan)))) or ["(no index: Seq Scan)"]
                total = next((p for p in plan if p.startswith("Execution Time")), "")
                print(f"{name:<36} {', '.join(used):<48} {total}")
            else:
                print(f"## {name}\n" + "\n".join("    " + p for p in plan) + "\n")
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
