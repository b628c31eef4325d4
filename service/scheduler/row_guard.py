"""One row, one savepoint: a row the database refuses must not stall every other run.

Each run's step runs in its own savepoint. An outage (connection lost, server gone) is re-raised:
the whole pass stops and the loop backs off. Anything else (a DataError on an odd document, a bug
that only this row's data triggers) rolls back only that row, counts against its run, and after
PARITY_MAX_ROW_FAILURES consecutive failures ends the run in `error` with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

from models import Phase, Run
from service.core.phase_state import PHASE_ACTIVE, PhaseState, move_phase
from service.core.run_state import TERMINAL, RunState
from service.core.settings import Settings
from service.executors import launcher
from service.runs.lifecycle import transition
from service.scheduler.submitter import job_of

log = logging.getLogger(__name__)


def is_outage(exc: BaseException) -> bool:
    """Whether an exception means the database is unreachable (as opposed to refusing one row's data)."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def describe(exc: BaseException) -> str:
    """One storable line about an exception (no NUL, bounded)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}".replace("\x00", "\ufffd")[:1000]


def per_row(session: Session, run: Run, step: Callable[[], None], *, settings: Settings, what: str) -> bool:
    """Run step in a savepoint of its own. True when it went through; outages are re-raised."""
    try:
        with session.begin_nested():
            step()
    except Exception as exc:
        if is_outage(exc):
            raise
        log.warning("run %s: %s failed (%s)", run.id, what, describe(exc), exc_info=True)
        _count_failure(session, run, f"{what}: {describe(exc)}", settings)
        return False
    if run.scheduler_failures:
        run.scheduler_failures = 0
    return True


def _count_failure(session: Session, run: Run, reason: str, settings: Settings) -> None:
    run.scheduler_failures = (run.scheduler_failures or 0) + 1
    if run.scheduler_failures < settings.max_row_failures or RunState(run.state) in TERMINAL:
        return
    message = f"the scheduler gave up after {run.scheduler_failures} failed tries: {reason}"
    try:
        _give_up(session, run, message)
    except Exception as exc:
        if is_outage(exc):
            raise
        log.exception("run %s: could not end it in error", run.id)


def _give_up(session: Session, run: Run, message: str) -> None:
    with session.begin_nested():
        open_states = [s.value for s in PHASE_ACTIVE] + [PhaseState.PENDING.value]
        for phase in session.scalars(select(Phase).where(Phase.run_id == run.id, Phase.state.in_(open_states))).all():
            _stop(phase, run)
            move_phase(session, phase, PhaseState.ERROR, message)
        run.error_message = message
        transition(session, run, RunState.ERROR, message)


def _stop(phase: Phase, run: Run) -> None:
    if not phase.job_id:
        return
    try:
        launcher.cancel(job_of(phase, run))
    except Exception as exc:  # best effort: the run is ended either way, and says why
        log.warning("run %s: could not cancel %s job %s: %s", run.id, phase.executor, phase.job_id, exc)
