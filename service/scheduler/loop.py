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

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, OperationalError

from models import SchedulerHeartbeat
from models.base import utcnow
from service import retention
from service.db import session_scope
from service.evaluation import evaluate_one
from service.scheduler.reconciler import reconcile
from service.scheduler.submitter import claim_queued, launch_one
from service.selftest import enqueue_due
from service.settings import Settings

log = logging.getLogger(__name__)


def replica_name() -> str:
    """host:pid, the heartbeat key of this scheduler process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def heartbeat(name: str) -> None:
    """Record that this replica is alive."""
    with session_scope() as session:
        stmt = insert(SchedulerHeartbeat).values(name=name, seen_at=utcnow(), detail="")
        session.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"seen_at": utcnow()}))


def tick(settings: Settings, *, max_launches: int = 10) -> dict[str, int]:
    """One pass of every step; returns what each step did."""
    done = {"claimed": 0, "launched": 0, "reconciled": 0, "evaluated": 0, "pruned": 0, "selftest_queued": 0}
    with session_scope() as session:
        done["selftest_queued"] = enqueue_due(session, settings=settings)
    with session_scope() as session:
        done["claimed"] = claim_queued(session, settings=settings)
    for _ in range(max_launches):
        with session_scope() as session:
            if not launch_one(session, settings=settings):
                break
        done["launched"] += 1
    with session_scope() as session:
        done["reconciled"] = reconcile(session, settings=settings)
    while True:
        with session_scope() as session:
            if not evaluate_one(session):
                break
        done["evaluated"] += 1
    with session_scope() as session:
        done["pruned"] = sum(retention.apply(session, settings).values())
    return done


def run_forever(settings: Settings, stop: threading.Event | None = None) -> None:
    """Loop until stop is set (or forever), surviving database outages."""
    stop = stop or threading.Event()
    name = replica_name()
    failures = 0
    log.info("scheduler %s started (poll every %.1fs)", name, settings.scheduler_poll_seconds)
    while not stop.is_set():
        try:
            heartbeat(name)
            done = tick(settings)
            if any(done.values()):
                log.info("tick: %s", done)
            failures = 0
            delay = settings.scheduler_poll_seconds
        except (OperationalError, DBAPIError) as exc:
            failures += 1
            delay = min(30.0, settings.scheduler_poll_seconds * 2**failures)
            log.warning("database unavailable (%s); retrying in %.0fs", str(exc).splitlines()[0], delay)
        except Exception:  # a bug in one step must not stop every other run; its transaction rolled back
            failures += 1
            delay = min(30.0, settings.scheduler_poll_seconds * 2**failures)
            log.exception("scheduler step failed; retrying in %.0fs", delay)
        stop.wait(delay)
    log.info("scheduler %s stopped", name)


