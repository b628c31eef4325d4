"""A run's lifecycle: the one way a run changes state, and what entering a final state does.

`transition` applies the state machine (service/core/run_state.py: the states and the allowed moves) and,
when the run enters a final state, remembers it on the session. When that transaction (or the savepoint it
ran in) commits, every handler in `ON_FINISHED` runs for it, in the same transaction, after whatever the
path that ended the run did before committing (a verdict's regression flags included). So every way a run
can end — a verdict, the submitter's give-up, the row guard's, a failed build or import check, a deadline, a
cancel — runs the same handlers, and no call site calls them (the suite's one alert was once called from two
of five such paths, and a suite could fail without alerting anyone).

Prefect's orchestration rules are the model: the move is checked, recorded as an event row, and the final
state's handlers are attached to the state, not to whoever moved the run there.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session

from models import Run
from service.core.run_state import TERMINAL, RunState, apply_transition
from service.oncall import notification_events, suite_alerts

FinishHandler = Callable[[Session, Run], object]

# Run for each run entering a final state, in this order, at its transaction's commit. Each must be
# idempotent (a savepoint released and then its outer transaction committed runs a run's handlers once, but
# a retried transaction runs them again): the suite alert is keyed by the suite run's id.
ON_FINISHED: tuple[FinishHandler, ...] = (
    suite_alerts.on_check_ended,  # the suite run's one alert, once its last check has ended (any way)
    notification_events.on_run_ended,  # an infrastructure error's streak alert, whichever path ended the run
)
_FINISHED = "parity_runs_finished"  # session.info key: runs that entered a final state in this transaction


def transition(session: Session, run: Run, target: RunState, reason: str = "") -> None:
    """Move run to target (refused when the state machine does not allow it) and record the event; a final
    state's handlers run when this transaction commits."""
    apply_transition(session, run, target, reason)
    if target in TERMINAL:
        session.info.setdefault(_FINISHED, []).append(run)


@event.listens_for(Session, "before_commit")
def _run_finish_handlers(session: Session) -> None:
    finished: list[Run] = session.info.pop(_FINISHED, [])
    for run in finished:
        if RunState(run.state) not in TERMINAL:  # its savepoint was rolled back: it did not end after all
            continue
        for handler in ON_FINISHED:
            handler(session, run)


@event.listens_for(Session, "after_rollback")
def _forget_unfinished(session: Session) -> None:
    session.info.pop(_FINISHED, None)
