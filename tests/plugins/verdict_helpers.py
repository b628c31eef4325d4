"""Test helper: take a run queued through the API to a verdict along the evaluator's own path."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy.orm import Session

from jobs.contract import Verdict, parity_result
from models import Run
from service.core.run_state import RunState
from service.runs.evaluation import VERDICT_STATE, store_result
from service.runs.lifecycle import transition


def finish(session: Session, run_id: int, verdict: str, signatures: list[str] | None = None,
           **result: Any) -> Run:
    """Move a queued run through submitted -> evaluating, store a result with verdict and commit (as the scheduler
    does)."""
    run = session.get(Run, run_id)
    assert run is not None
    transition(session, run, RunState.TRAIN_SUBMITTED, "test")
    transition(session, run, RunState.EVALUATING, "test")
    typed = cast(Verdict, verdict)
    store_result(session, run, parity_result(typed, run.spec, signatures=signatures or [], **result))
    transition(session, run, VERDICT_STATE[typed], f"verdict {verdict}")
    session.commit()  # as the scheduler's evaluation does: the final state's handlers run at the commit
    return run
