"""The phase state machine: every allowed move is recorded with its timestamps, every other is refused."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Environment, Phase, PhaseEvent, Run
from service.core.errors import Conflict
from service.core.phase_state import PHASE_TERMINAL, PHASE_TRANSITIONS, PhaseState, move_phase

P = PhaseState
ALLOWED = {
    (P.PENDING, P.SUBMITTED), (P.PENDING, P.INFRA_FAILED), (P.PENDING, P.CANCELLED), (P.PENDING, P.ERROR),
    (P.SUBMITTED, P.RUNNING), (P.SUBMITTED, P.SUCCEEDED), (P.SUBMITTED, P.FAILED), (P.SUBMITTED, P.INFRA_FAILED),
    (P.SUBMITTED, P.CANCELLING), (P.SUBMITTED, P.ERROR),
    (P.RUNNING, P.SUCCEEDED), (P.RUNNING, P.FAILED), (P.RUNNING, P.INFRA_FAILED), (P.RUNNING, P.CANCELLING),
    (P.RUNNING, P.ERROR),
    (P.CANCELLING, P.CANCELLED), (P.CANCELLING, P.ERROR),
}


def _phase(session: Session, state: PhaseState = P.PENDING) -> Phase:
    env = Environment(name="phase-env", python="python", packages={})
    session.add(env)
    session.flush()
    run = Run(config="dense-bf16", spec={"dp": 1}, environment_id=env.id, labels={}, signatures=[], summary={})
    session.add(run)
    session.flush()
    phase = Phase(run_id=run.id, name="train_and_save", attempt=1, state=state.value, executor="local",
                  folder="/x", info={}, log_paths=[])
    session.add(phase)
    session.flush()
    return phase


def test_the_table_is_exactly_the_allowed_moves() -> None:
    table = {(a, b) for a, targets in PHASE_TRANSITIONS.items() for b in targets}
    assert table == ALLOWED
    assert set(PHASE_TRANSITIONS) == set(PhaseState)
    for state in PHASE_TERMINAL:
        assert PHASE_TRANSITIONS[state] == frozenset()


@pytest.mark.parametrize(("source", "target"), sorted(ALLOWED))
def test_every_allowed_move_is_recorded(db_session: Session, source: PhaseState, target: PhaseState) -> None:
    phase = _phase(db_session, source)
    move_phase(db_session, phase, target, "because")
    event = db_session.scalars(select(PhaseEvent).where(PhaseEvent.phase_id == phase.id)).one()
    assert (event.from_state, event.to_state, event.reason, event.run_id) == (
        source.value, target.value, "because", phase.run_id)
    assert phase.state == target.value
    assert (phase.ended_at is not None) == (target in PHASE_TERMINAL)


def test_every_other_move_is_refused(db_session: Session) -> None:
    phase = _phase(db_session)
    for source in PhaseState:
        for target in PhaseState:
            if (source, target) in ALLOWED:
                continue
            phase.state = source.value
            with pytest.raises(Conflict, match=f"from {source.value} to {target.value}"):
                move_phase(db_session, phase, target)
    assert db_session.scalars(select(PhaseEvent).where(PhaseEvent.phase_id == phase.id)).all() == []


def test_a_lifecycle_stamps_its_times(db_session: Session) -> None:
    phase = _phase(db_session)
    for target in (P.SUBMITTED, P.RUNNING, P.SUCCEEDED):
        move_phase(db_session, phase, target)
    assert phase.submitted_at and phase.started_at and phase.ended_at and phase.duration_s is not None
    assert phase.exit_reason is None
