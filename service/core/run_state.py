"""The one state machine of a run: its states and allowed transitions, and the function that applies a move
(called only by service/runs/lifecycle.py, which runs the final states' handlers)."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy.orm import Session

from models import Run, RunEvent
from models.base import utcnow
from service.core.errors import Conflict
from service.core.state_names import FINISHED_RUN_STATES


class RunState(StrEnum):
    QUEUED = "queued"
    TRAIN_SUBMITTED = "train_submitted"
    TRAIN_RUNNING = "train_running"
    RESUME_SUBMITTED = "resume_submitted"
    RESUME_RUNNING = "resume_running"
    EVALUATING = "evaluating"
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    CANCELLED = "cancelled"


S = RunState
# the finished states, named once (state_names.py, for the client too): "is it done?" reads these two
TERMINAL = frozenset(RunState(s) for s in FINISHED_RUN_STATES)
UNFINISHED = frozenset(s for s in RunState if s not in TERMINAL)
IN_FLIGHT = frozenset({S.TRAIN_SUBMITTED, S.TRAIN_RUNNING, S.RESUME_SUBMITTED, S.RESUME_RUNNING})

# from -> allowed targets. A phase may finish before the reconciler ever sees it running, so
# "submitted" can go straight to the next phase; an infra retry goes back to "submitted". A run waiting for its
# first phase may end `failed` straight away: the build's answer before any phase ran (megatron.core that does not
# import, service/runs/import_check.py), judged with a stored result as an evaluation is.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    S.QUEUED: frozenset({S.TRAIN_SUBMITTED, S.CANCELLED, S.ERROR, S.FAILED}),
    S.TRAIN_SUBMITTED: frozenset(
        {S.TRAIN_RUNNING, S.TRAIN_SUBMITTED, S.RESUME_SUBMITTED, S.EVALUATING, S.ERROR, S.CANCELLED, S.FAILED}
    ),
    S.TRAIN_RUNNING: frozenset({S.TRAIN_SUBMITTED, S.RESUME_SUBMITTED, S.EVALUATING, S.ERROR, S.CANCELLED}),
    S.RESUME_SUBMITTED: frozenset({S.RESUME_RUNNING, S.RESUME_SUBMITTED, S.EVALUATING, S.ERROR, S.CANCELLED}),
    S.RESUME_RUNNING: frozenset({S.RESUME_SUBMITTED, S.EVALUATING, S.ERROR, S.CANCELLED}),
    S.EVALUATING: frozenset({S.PASSED, S.FAILED, S.ERROR}),
    S.PASSED: frozenset(),
    S.FAILED: frozenset(),
    S.ERROR: frozenset(),
    S.CANCELLED: frozenset(),
}


def can_transition(current: str, target: str) -> bool:
    """Whether the state machine allows current -> target."""
    return RunState(target) in TRANSITIONS[RunState(current)]


def apply_transition(session: Session, run: Run, target: RunState, reason: str = "") -> None:
    """Move run to target, stamp its timestamps and record the event; refuse invalid moves. Only
    service/runs/lifecycle.transition calls this: it adds what entering a final state does."""
    current = RunState(run.state)
    if target not in TRANSITIONS[current]:
        raise Conflict(f"run {run.id}: cannot go from {current.value} to {target.value}", field="state")
    now = utcnow()
    session.add(RunEvent(run_id=run.id, from_state=current.value, to_state=target.value, reason=reason, at=now))
    run.state = target.value
    run.state_version += 1
    run.updated_at = now
    if target is S.TRAIN_SUBMITTED and run.submitted_at is None:
        run.submitted_at = now
    if target in (S.TRAIN_RUNNING, S.RESUME_SUBMITTED) and run.started_at is None:
        run.started_at = now
    if target in TERMINAL:
        run.finished_at = now
