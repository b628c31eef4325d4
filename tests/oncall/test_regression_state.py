"""Regressions move through one state machine with recorded transitions: opened, acknowledged and resolved
each leave a RegressionEvent, and a move the machine does not allow (a resolved regression acknowledged) is
a 409 that records nothing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Environment, Regression, RegressionEvent, Run
from service.core.errors import Conflict
from service.oncall import regressions
from tests.plugins.seed import spec


def _run(session: Session, env: Environment, verdict: str, **extra) -> Run:
    run = Run(environment_id=env.id, config="moe-fp32-router", spec=spec(), labels={"branch": "main"},
              state="failed" if verdict == "fail" else "passed", verdict=verdict, signatures=[], summary={}, **extra)
    session.add(run)
    session.flush()
    return run


@dataclass(frozen=True)
class _Grant:
    """A token that may write every track (the admin's), by name."""

    name: str
    scopes: tuple[str, ...] = ("admin",)
    tracks: tuple[str, ...] = ("*",)


def _events(session: Session, reg: Regression) -> list[tuple[str | None, str]]:
    rows = session.scalars(select(RegressionEvent).where(RegressionEvent.regression_id == reg.id)
                           .order_by(RegressionEvent.id))
    return [(e.from_state, e.to_state) for e in rows]


def test_each_change_of_state_is_recorded_and_a_disallowed_one_refused(db_session: Session) -> None:
    env = Environment(name="mcore", python="/usr/bin/python3", state="ready")
    db_session.add(env)
    db_session.flush()
    failed = _run(db_session, env, "fail", regression=True)
    reg = regressions.on_verdict(db_session, failed)
    assert reg is not None and reg.state == "open"
    regressions.acknowledge(db_session, reg.id, grant=_Grant("alice"), note="looking")
    regressions.acknowledge(db_session, reg.id, grant=_Grant("bob"))  # taken over: recorded again
    resolved = regressions.on_verdict(db_session, _run(db_session, env, "pass"))
    assert resolved is reg and reg.state == "resolved" and reg.resolved_at is not None
    assert _events(db_session, reg) == [(None, "open"), ("open", "acknowledged"),
                                        ("acknowledged", "acknowledged"), ("acknowledged", "resolved")]
    with pytest.raises(Conflict, match="resolved"):
        regressions.acknowledge(db_session, reg.id, grant=_Grant("carol"))
    assert len(_events(db_session, reg)) == 4 and reg.acknowledged_by == "bob"
