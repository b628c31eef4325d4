"""The state machine of one phase attempt: the allowed moves and the only function that applies them.

A phase row is one attempt of one phase; a retry is a new row, so no state leads back to pending.
`cancelling` holds until the executor confirms the job has ended; only then is it `cancelled`.
`error` means the scheduler gave up on the row (its data could not be stored, or it was
abandoned with its run), as opposed to `failed` (the job ran and failed) and `infra_failed`
(the infrastructure stopped it; retried as a new attempt).
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy.orm import Session

from models import Phase, PhaseEvent
from models.base import utcnow
from service.core.errors import Conflict


class PhaseState(StrEnum):
    PENDING = "pending"
    SUBMITTED = "submitted"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INFRA_FAILED = "infra_failed"
    CANCELLED = "cancelled"
    ERROR = "error"


P = PhaseState
PHASE_TERMINAL = frozenset({P.SUCCEEDED, P.FAILED, P.INFRA_FAILED, P.CANCELLED, P.ERROR})
# The phases the reconciler watches: a job exists (or is being stopped) for each.
PHASE_ACTIVE = frozenset({P.SUBMITTED, P.RUNNING, P.CANCELLING})

# A job may end before the reconciler ever sees it running, so submitted can go straight to an end.
PHASE_TRANSITIONS: dict[PhaseState, frozenset[PhaseState]] = {
    P.PENDING: frozenset({P.SUBMITTED, P.INFRA_FAILED, P.CANCELLED, P.ERROR}),
    P.SUBMITTED: frozenset({P.RUNNING, P.SUCCEEDED, P.FAILED, P.INFRA_FAILED, P.CANCELLING, P.ERROR}),
    P.RUNNING: frozenset({P.SUCCEEDED, P.FAILED, P.INFRA_FAILED, P.CANCELLING, P.ERROR}),
    P.CANCELLING: frozenset({P.CANCELLED, P.ERROR}),
    **{state: frozenset() for state in PHASE_TERMINAL},
}


def move_phase(session: Session, phase: Phase, target: PhaseState, reason: str = "") -> None:
    """Move phase to target, stamp its timestamps and record the event; refuse invalid moves."""
    current = PhaseState(phase.state)
    if target not in PHASE_TRANSITIONS[current]:
        raise Conflict(f"phase {phase.id}: cannot go from {current.value} to {target.value}", field="state")
    now = utcnow()
    session.add(PhaseEvent(phase_id=phase.id, run_id=phase.run_id, from_state=current.value,
                           to_state=target.value, reason=reason[:4000], at=now))
    phase.state = target.value
    if target is P.SUBMITTED:
        phase.submitted_at = now
    if target is P.RUNNING:
        phase.started_at = now
    if target in PHASE_TERMINAL:
        phase.ended_at = now
        if phase.exit_reason is None and target is not P.SUCCEEDED:
            phase.exit_reason = reason[:4000]
        begun = phase.started_at or phase.submitted_at
        if begun is not None:
            phase.duration_s = (now - begun).total_seconds()


def record_new_phase(session: Session, phase: Phase, reason: str) -> None:
    """Record the creation of a (pending) phase row, so its history starts with it."""
    session.add(PhaseEvent(phase_id=phase.id, run_id=phase.run_id, from_state=None,
                           to_state=phase.state, reason=reason, at=utcnow()))
