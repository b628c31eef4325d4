"""Regression flagging: compare a finished run's verdict with the history of its config × environment."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Run

# pass is good; fail and error are both "not the same run" for the history
BAD = frozenset({"fail", "error"})


def previous_finished(session: Session, run: Run) -> Run | None:
    """The latest run with a verdict for the same config and environment, finished before run."""
    return session.scalar(
        select(Run)
        .where(
            Run.config == run.config, Run.environment_id == run.environment_id, Run.id != run.id,
            Run.verdict.is_not(None), Run.finished_at.is_not(None),
        )
        .order_by(Run.finished_at.desc(), Run.id.desc())
        .limit(1)
    )


def last_good(session: Session, run: Run) -> Run | None:
    """The latest passing run for the same config and environment before run."""
    return session.scalar(
        select(Run)
        .where(
            Run.config == run.config, Run.environment_id == run.environment_id, Run.id != run.id,
            Run.verdict == "pass",
        )
        .order_by(Run.finished_at.desc(), Run.id.desc())
        .limit(1)
    )


def flag(session: Session, run: Run) -> None:
    """Set regression, last_good_run_id and failing_since_run_id on a run that just got its verdict."""
    if run.verdict not in BAD:
        run.regression, run.failing_since_run_id = False, None
        return
    good = last_good(session, run)
    run.last_good_run_id = good.id if good else None
    previous = previous_finished(session, run)
    if previous is not None and previous.verdict in BAD:
        # still failing: not a new regression; point at the run where the streak began
        run.regression = False
        run.failing_since_run_id = previous.failing_since_run_id or previous.id
    else:
        run.regression = previous is not None and previous.verdict == "pass"
        run.failing_since_run_id = run.id
