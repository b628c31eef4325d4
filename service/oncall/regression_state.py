"""The one state machine of a regression: its states, the allowed moves and the only function that makes
them, each recorded as a RegressionEvent (as service/core/run_state.py does for runs)."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy.orm import Session

from models import Regression, RegressionEvent
from models.base import utcnow
from service.core.errors import Conflict


class RegressionState(StrEnum):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


R = RegressionState
UNRESOLVED = frozenset({R.OPEN, R.ACKNOWLEDGED})
# from -> allowed targets: acknowledging an acknowledged one updates who owns it (recorded again)
TRANSITIONS: dict[RegressionState, frozenset[RegressionState]] = {
    R.OPEN: frozenset({R.ACKNOWLEDGED, R.RESOLVED}),
    R.ACKNOWLEDGED: frozenset({R.ACKNOWLEDGED, R.RESOLVED}),
    R.RESOLVED: frozenset(),
}


def opened(session: Session, regression: Regression, reason: str) -> None:
    """Record a new regression's first state (flushed, so it has an id)."""
    regression.state = R.OPEN.value
    session.add(regression)
    session.flush()
    session.add(RegressionEvent(regression_id=regression.id, from_state=None, to_state=R.OPEN.value, reason=reason))


def move(session: Session, regression: Regression, target: RegressionState, reason: str) -> None:
    """Move regression to target, stamp it and record the event; refuse a move the machine does not allow."""
    current = RegressionState(regression.state)
    if target not in TRANSITIONS[current]:
        raise Conflict(f"regression {regression.id} is {current.value}; it cannot become {target.value}",
                       field="state")
    now = utcnow()
    session.add(RegressionEvent(regression_id=regression.id, from_state=current.value, to_state=target.value,
                                reason=reason, at=now))
    regression.state = target.value
    if target is R.ACKNOWLEDGED:
        regression.acknowledged_at = now
    if target is R.RESOLVED:
        regression.resolved_at = now
