"""The scheduler process: heartbeat, claim, launch, reconcile, evaluate — one transaction per step.

Every step is idempotent and all state lives in Postgres and the run folders, so a killed scheduler
restarts where it left off and several replicas can run side by side. If the database goes away,
the loop logs one line per attempt, backs off, and carries on when it returns.

Between ticks the loop sleeps on events (service/scheduler/wakeup.py): a NOTIFY from the API when a
run is queued, or a rank document appearing for an in-flight phase; the poll interval is only the
fallback. A tick that changed something is followed at once by another, so the next step (submit
the resume, evaluate) does not wait for an event that already happened.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from functools import partial
from pathlib import Path

from sqlalchemy.dialects.postgresql import insert

from models import Run, SchedulerHeartbeat
from models.base import utcnow
from service.artifacts.store import prune_artifacts
from service.bisects import search as bisects
from service.core.db import get_engine, session_scope
from service.core.settings import Settings
from service.environments import build_steps as builds
from service.executors import pool
from service.executors.selection import pick_executor
from service.oncall.delivery import DeliveryWorker
from service.runs import import_check, pool_dispatch, retention
from service.scheduler.evaluation import evaluate_pending
from service.scheduler.reconciler import reconcile, watched_files
from service.scheduler.row_guard import describe, is_outage, per_row
from service.scheduler.submitter import claim_queued, launch, local_slots, next_pending
from service.scheduler.wakeup import Wakeup
from service.selftest.batch import enqueue_due
from service.tracks import schedule as tracks

log = logging.getLogger(__name__)
MAX_LAUNCHES_PER_TICK = 10  # phases one tick launches at most: the rest wait for the next (at once: it ticks again)


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


def tick(
    settings: Settings, *, executor: str,
    pool_keys: dict[int, pool_dispatch.PoolKey] | None = None,
) -> dict[str, int]:
    """One pass of every step; returns what each step did. pool_keys: the loop's memory of which
    pool key each waiting attempt needs (pool_dispatch.TickWaits), kept from tick to tick."""
    done = {"claimed": 0, "launched": 0, "reconciled": 0, "evaluated": 0, "pruned": 0,
            "selftest_queued": 0, "builds": 0, "bisects": 0, "pool": 0, "tracks": 0}
    with session_scope() as session:
        done["selftest_queued"] = enqueue_due(session, settings=settings)
    with session_scope() as session:  # due tracks: their suite on the source's latest commit (its build queued)
        done["tracks"] = tracks.run_due(session, settings=settings)
    with session_scope() as session:
        done["builds"] = builds.launch_builds(session, settings=settings, executor=executor)
    with session_scope() as session:
        done["builds"] += builds.reconcile_builds(session, settings)
        import_check.fail_runs_on_failed_builds(session)
        builds.prune_builds(session, keep_days=settings.env_keep_days)
        prune_artifacts(session, settings=settings)
    with session_scope() as session:
        done["claimed"] = claim_queued(session, settings=settings, executor=executor)
    with session_scope() as session:  # finished orders back, idle workers out, workers for waiting attempts
        moved = pool_dispatch.maintain(session, settings=settings, executor=executor)
        # a sweep of old folders is housekeeping, not progress: it must not make the loop spin
        done["pool"] = moved["released"] + moved["retired"] + moved["started"] + moved["import_failed"]
    # attempts left pending for a warm worker, keys with none idle
    waits = pool_dispatch.TickWaits(keys={} if pool_keys is None else pool_keys)
    for background in (False, True):  # user work first; background work in what it leaves (submitter.py)
        done["launched"] += _launch_pending(settings, executor=executor, waits=waits, background=background,
                                            most=MAX_LAUNCHES_PER_TICK - done["launched"])
    with session_scope() as session:
        done["reconciled"] = reconcile(session, settings=settings, executor=executor)
    with session_scope() as session:
        done["evaluated"] = evaluate_pending(session, settings=settings)
    with session_scope() as session:  # a verdict just stored may decide a bisect's step (or queue its next run)
        done["bisects"] = bisects.advance_open(session, settings=settings)
    with session_scope() as session:  # a track's new regression starts its bisect; a found one names the commit
        done["bisects"] += tracks.bisect_regressions(session, settings=settings)
    with session_scope() as session:
        done["pruned"] = sum(retention.apply(session, settings).values())
    return done


def _launch_pending(
    settings: Settings, *, executor: str, waits: pool_dispatch.TickWaits, background: bool, most: int
) -> int:
    """Launch up to `most` pending phases of user (or background) work; returns how many were submitted."""
    slots = most
    if executor == "local":  # Slurm queues by CPUs itself
        with session_scope() as session:
            slots = min(slots, local_slots(session, settings, background=background))
    launched = 0
    for _ in range(slots):
        # one transaction per launch: the pending row stays committed until the submission is recorded
        with session_scope() as session:
            phase = next_pending(session, waits.skip(), background=background)
            if phase is None:
                break
            run = session.get(Run, phase.run_id)
            assert run is not None
            step = partial(launch, session, phase, settings=settings, executor=executor, waits=waits)
            launched += per_row(session, run, step, settings=settings,
                                what=f"launching {phase.name} attempt {phase.attempt}") and phase.id not in waits.phases
    return launched


def _database_url() -> str:
    return get_engine().url.render_as_string(hide_password=False)


def _watch(settings: Settings) -> list[Path]:
    # a warm order's done reports too: the order is taken back (and the suite's next check placed) at
    # once, not a poll interval after the attempt's last document; and a worker's import report, so a new
    # environment's import check settles (and its first check is placed) as soon as it is written
    with session_scope() as session:
        return watched_files(session, settings=settings) + pool.awaited_reports(settings)


def run_forever(settings: Settings, stop: threading.Event | None = None, executor: str | None = None) -> None:
    """Loop until stop is set (or forever), surviving database outages."""
    stop = stop or threading.Event()
    name = replica_name()
    executor = executor or decide_executor(settings)
    wake = Wakeup(_database_url, stop)
    # notifications go out from their own thread: a slow receiver must not hold up any run
    delivery = DeliveryWorker(stop, interval_s=settings.scheduler_poll_seconds)
    delivery.start()
    failures = 0
    pool_keys: dict[int, pool_dispatch.PoolKey] = {}
    last_beat = float("-inf")
    log.info("scheduler %s started (executor %s; events, polling every %.1fs)", name, executor,
             settings.scheduler_poll_seconds)
    while not stop.is_set():
        watch: list[Path] = []
        try:
            if time.monotonic() - last_beat >= min(settings.scheduler_poll_seconds, 10.0):
                heartbeat(name, executor)
                last_beat = time.monotonic()
            done = tick(settings, executor=executor, pool_keys=pool_keys)
            if any(done.values()):
                log.info("tick: %s", done)
            failures = 0
            # something moved: tick again now, its follow-up (a resume to submit, a run to evaluate) is ready
            delay = 0.0 if any(done.values()) else settings.scheduler_poll_seconds
            watch = _watch(settings) if delay else []
        except Exception as exc:  # a bug in one step must not stop every other run; its transaction rolled back
            failures += 1
            delay = min(30.0, settings.scheduler_poll_seconds * 2**failures)
            if is_outage(exc):
                log.warning("database unavailable (%s); retrying in %.0fs", describe(exc), delay)
            else:
                log.exception("scheduler step failed; retrying in %.0fs", delay)
        if delay:
            wake.wait(delay, watch)
    wake.close()
    delivery.join(timeout=30)
    log.info("scheduler %s stopped", name)
