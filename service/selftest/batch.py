"""Detector health: the mutation self-test queued periodically as ordinary runs, and its latest outcome.

Each batch is the whole catalogue one mutant per run, with a control per base, plus the combined
smoke test (jobs/selftest/catalogue.py `health_specs`), labelled `selftest=detector-health` and
`selftest_batch=<time>`; the overview judges the latest batch against the catalogue: every fault
caught, nothing benign flagged.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, literal_column, select
from sqlalchemy.orm import Session

from jobs.selftest.catalogue import expectation, health_specs, judge
from jobs.spec import RunSpec
from models import Run
from service.core.checks import SELFTEST_LABEL
from service.core.run_state import IN_FLIGHT, RunState
from service.core.settings import Settings
from service.environments.registry import ensure_default_environment
from service.runs.records import create_run

LABEL = SELFTEST_LABEL
VALUE = "detector-health"
# Implied by labels->>'selftest' = VALUE, and written out (a literal, not a parameter) so Postgres
# reads the small partial index ix_runs_selftest instead of every run: the overview asks for the
# detector's health on every view, and without it that cost grew with the whole history.
MARKED = Run.labels.has_key(literal_column(f"'{LABEL}'"))
LOCK_ID = 0x5E1F7E57  # one enqueuer at a time across scheduler replicas


def enqueue_due(session: Session, *, settings: Settings, now: datetime | None = None) -> int:
    """Queue a detector-health batch when the last one is older than the interval and the service
    is idle (nothing queued or running, so CI's runs never wait behind it); return runs queued."""
    if settings.selftest_interval_hours <= 0:
        return 0
    now = now or datetime.now(UTC)
    session.execute(select(func.pg_advisory_xact_lock(LOCK_ID)))
    busy = [RunState.QUEUED.value, RunState.EVALUATING.value, *(s.value for s in IN_FLIGHT)]
    if session.scalar(select(Run.id).where(Run.state.in_(busy)).limit(1)) is not None:
        return 0
    last = session.scalar(select(func.max(Run.created_at)).where(MARKED, Run.labels[LABEL].astext == VALUE))
    if last is not None and now - last < timedelta(hours=settings.selftest_interval_hours):
        return 0
    env = ensure_default_environment(session, settings=settings)
    batch = now.strftime("%Y%m%dT%H%M%S")
    specs = health_specs()
    for name, spec in specs:
        create_run(session, spec=RunSpec.from_dict(spec), environment=env,
                   labels={LABEL: VALUE, "selftest_batch": batch, "mutant": name}, requester="detector-health")
    return len(specs)


def detector_health(session: Session) -> dict[str, Any] | None:
    """The latest batch judged against the catalogue, or None when no batch was ever queued."""
    batch = session.scalar(
        select(Run.labels["selftest_batch"].astext).where(MARKED, Run.labels[LABEL].astext == VALUE)
        .order_by(Run.created_at.desc()).limit(1)
    )
    if batch is None:
        return None
    runs = session.scalars(
        select(Run).where(MARKED, Run.labels[LABEL].astext == VALUE, Run.labels["selftest_batch"].astext == batch)
        .order_by(Run.id)
    ).all()
    rows = []
    for run in runs:
        mutant = expectation(run.spec.get("mutants") or [])
        row: dict[str, Any] = {"run_id": run.id, "mutant": run.labels.get("mutant"), "expect": []}
        if mutant is not None:
            row["expect"] = list(mutant.expect)
        if run.verdict is None:
            row.update(outcome="pending", ok=None, verdict=None, signatures=[])
        else:
            row.update(judge(mutant, {"verdict": run.verdict, "signatures": run.signatures,
                                      "first_divergent_step": run.first_divergent_step}))
        rows.append(row)
    done = [r for r in rows if r["ok"] is not None]
    return {
        "batch": batch,
        "rows": rows,
        "pending": len(rows) - len(done),
        "caught": sum(r["outcome"] == "caught" for r in done),
        "missed": sum(r["outcome"] == "missed" for r in done),
        "false_alarms": sum(r["outcome"] == "false alarm" for r in done),
        "healthy": bool(done) and len(done) == len(rows) and all(r["ok"] for r in done),
    }
