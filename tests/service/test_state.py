"""The run state machine: allowed moves are recorded with timestamps, others are refused."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Environment, Run, RunEvent
from service.core.errors import Conflict
from service.core.run_state import TERMINAL, TRANSITIONS, RunState, can_transition
from service.runs.lifecycle import transition


def _run(session: Session) -> Run:
    env = Environment(name="state-env", python="python", packages={})
    session.add(env)
    session.flush()
    run = Run(config="dense-bf16", spec={"dp": 1}, environment_id=env.id, labels={}, signatures=[], summary={})
    session.add(run)
    session.flush()
    return run


def test_happy_path_is_recorded(db_session: Session) -> None:
    run = _run(db_session)
    path = [
        RunState.TRAIN_SUBMITTED, RunState.TRAIN_RUNNING, RunState.RESUME_SUBMITTED,
        RunState.RESUME_RUNNING, RunState.EVALUATING, RunState.PASSED,
    ]
    for target in path:
        transition(db_session, run, target, "test")
    events = db_session.scalars(select(RunEvent).where(RunEvent.run_id == run.id).order_by(RunEvent.id)).all()
    assert [e.to_state for e in events] == [s.value for s in path]
    assert events[0].from_state == "queued"
    assert run.state_version == len(path)
    assert run.submitted_at and run.started_at and run.finished_at


def test_invalid_transition_is_refused(db_session: Session) -> None:
    run = _run(db_session)
    with pytest.raises(Conflict, match="queued to passed"):
        transition(db_session, run, RunState.PASSED)
    assert run.state == "queued"


def test_terminal_states_are_final() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        assert not can_transition(state.value, RunState.QUEUED.value)


def test_the_clients_state_names_are_the_state_machines() -> None:
    """The client spells no run state: it reads them (and the wait bound) from service/core/state_names.py, which
    must name every state the machine has, each once."""
    from service.core.run_state import IN_FLIGHT, TERMINAL, RunState
    from service.core.state_names import FINISHED_RUN_STATES, QUEUED_RUN_STATE, RUNNING_RUN_STATES

    assert {s.value for s in TERMINAL} == FINISHED_RUN_STATES
    assert {s.value for s in IN_FLIGHT} | {RunState.EVALUATING.value} == RUNNING_RUN_STATES
    assert FINISHED_RUN_STATES | RUNNING_RUN_STATES | {QUEUED_RUN_STATE} == {s.value for s in RunState}
    assert not FINISHED_RUN_STATES & RUNNING_RUN_STATES
