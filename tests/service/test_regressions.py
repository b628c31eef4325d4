"""Regression flagging over the history of one config × environment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from models import Environment, Run
from service.oncall.flagging import flag

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _finished(session: Session, env: Environment, verdict: str, minute: int, config: str = "moe-fp32-router") -> Run:
    run = Run(
        config=config, spec={"config": config}, environment_id=env.id, labels={}, signatures=[], summary={},
        state="passed",
        verdict=verdict, finished_at=T0 + timedelta(minutes=minute),
    )
    session.add(run)
    session.flush()
    flag(session, run)
    session.flush()
    return run


def test_pass_then_fail_is_a_regression_linked_to_last_good(db_session: Session) -> None:
    env = Environment(name="reg-env", python="python", packages={})
    db_session.add(env)
    db_session.flush()
    good = _finished(db_session, env, "pass", 1)
    bad = _finished(db_session, env, "fail", 2)
    assert good.regression is False
    assert bad.regression is True
    assert bad.last_good_run_id == good.id
    assert bad.failing_since_run_id == bad.id


def test_fail_then_fail_is_still_failing_not_new(db_session: Session) -> None:
    env = Environment(name="reg-env2", python="python", packages={})
    db_session.add(env)
    db_session.flush()
    good = _finished(db_session, env, "pass", 1)
    first_bad = _finished(db_session, env, "fail", 2)
    could_not_tell = _finished(db_session, env, "error", 3)  # infrastructure's: in no streak, no history
    assert could_not_tell.regression is False and could_not_tell.failing_since_run_id is None
    second_bad = _finished(db_session, env, "fail", 4)
    assert second_bad.regression is False
    assert second_bad.failing_since_run_id == first_bad.id
    assert second_bad.last_good_run_id == good.id
    recovered = _finished(db_session, env, "pass", 5)
    assert recovered.regression is False and recovered.failing_since_run_id is None


def test_history_is_per_config(db_session: Session) -> None:
    env = Environment(name="reg-env3", python="python", packages={})
    db_session.add(env)
    db_session.flush()
    _finished(db_session, env, "pass", 1, config="dense-bf16")
    first = _finished(db_session, env, "fail", 2, config="moe-fp32-router")
    assert first.regression is False  # no earlier run of this config: nothing got worse
    assert first.last_good_run_id is None
