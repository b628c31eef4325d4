"""The scheduler process: heartbeat, claim, launch, reconcile, evaluate — one transaction per step.

Every step is idempotent and all state lives in Postgres and the run folders, so a killed scheduler
restarts where it left off and several replicas can run side by side. If the database goes away,
the loop logs one line per attempt, backs off, and carries on when it returns.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from functools import partial

from sqlalchemy.dialects.postgresql import insert

from models import Run, SchedulerHeartbeat
from models.base import utcnow
from service import retention
from service.db import session_scope
from service.evaluation import evaluate_pending
from service.scheduler.guard import describe, is_outage, per_row
from service.scheduler.reconciler import reconcile
from service.scheduler.submitter import claim_queued, launch, next_pending
from service.settings import Settings
from service.slurm import pick_executor

log = logging.getLogger(__name__)


def replica_name() -> str:
    """host:pid, the heartbeat key of this scheduler process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def decide_executor(settings: Settings) -> str:
    """The executor of this scheduler process, decided once: `slurm` never falls back to local."""
    executor = pick_executor(settings)
    log.info("executor %s for the life of this scheduler (PARITY_EXECUTOR=%s)", executor, settings.executor)
    return executor


def heartbeat(name: str, executor: str = "") -> None:
    """Record that this replica is alive, and which executor it runs phases with."""
    detail = f"executor={executor}" if executor else ""
    with session_scope() as session:
        stmt = insert(SchedulerHeartbeat).values(name=name, seen_at=utcnow(), detail=detail)
        session.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"seen_at": utcnow(),
                                                                                 "detail": detail}))


def tick(settings: Settings, *, executor: str, max_launches: int = 10) -> dict[str, int]:
    """One pass of every step; returns what each step did."""
    done = {"claimed": 0, "launched": 0, "reconciled": 0, "evaluated": 0, "pruned": 0}
    with session_scope() as session:
        done["claimed"] = claim_queued(session, settings=settings, executor=executor)
    for _ in range(max_launches):
        # one transaction per launch: the pending row stays committed until the submission is recorded
        with session_scope() as session:
            phase = next_pending(session)
            if phase is None:
                break
            run = session.get(Run, phase.run_id)
            assert run is not None
            per_row(session, run, partial(launch, session, phase, settings=settings, executor=executor),
                    settings=settings, what=f"launching {phase.name} attempt {phase.attempt}")
        done["launched"] += 1
    with session_scope() as session:
        done["reconciled"] = reconcile(session, settings=settings, executor=executor)
    with session_scope() as session:
        done["evaluated"] = evaluate_pending(session, settings=settings)
    with session_scope() as session:
        done["pruned"] = sum(retention.apply(session, settings).values())
    return done


def run_forever(settings: Settings, stop: threading.Event | None = None, executor: str | None = None) -> None:
    """Loop until stop is set (or forever), surviving database outages."""
    stop = stop or threading.Event()
    name = replica_name()
    executor = executor or decide_executor(settings)
    failures = 0
    log.info("scheduler %s started (executor %s, poll every %.1fs)", name, executor, settings.scheduler_poll_seconds)
    while not stop.is_set():
        try:
            heartbeat(name, executor)
            done = tick(settings, executor=executor)
            if any(done.values()):
                log.info("tick: %s", done)
            failures = 0
            delay = settings.scheduler_poll_seconds
        except Exception as exc:  # a bug in one step must not stop every other run; its transaction rolled back
            failures += 1
            delay = min(30.0, settings.scheduler_poll_seconds * 2**failures)
            if is_outage(exc):
                log.warning("database unavailable (%s); retrying in %.0fs", describe(exc), delay)
            else:
                log.exception("scheduler step failed; retrying in %.0fs", delay)
        stop.wait(delay)
    log.info("scheduler %s stopped", name)
