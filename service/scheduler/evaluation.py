"""The scheduler's evaluation step: pending runs in batches, each in a savepoint of its own (`row_guard.per_row`),
runs that failed before last, so a run whose result the database refuses never holds up the others. What an
evaluation does is the run's slice's (service/runs/evaluation.py)."""

from __future__ import annotations

from functools import partial

from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Run
from service.core.run_state import RunState
from service.core.settings import Settings
from service.runs.evaluation import evaluate_run
from service.scheduler.row_guard import per_row


def evaluate_pending(session: Session, *, settings: Settings, limit: int = 20) -> int:
    """Evaluate up to `limit` runs in state evaluating, each in its own savepoint. Returns how many went through."""
    runs = session.scalars(
        select(Run).where(Run.state == RunState.EVALUATING.value)
        .order_by(Run.scheduler_failures, Run.id).limit(limit).with_for_update(skip_locked=True)
    ).all()
    return sum(per_row(session, run, partial(evaluate_run, session, run), settings=settings, what="evaluation")
               for run in runs)
