"""Which pending attempt goes to which warm worker, and how many workers each environment keeps.

`route` is asked by the submitter before a cold submission: an attempt whose environment and world
size have a PARITY_POOL entry goes to an idle worker of that key (an order in the worker's folder),
or waits pending while a worker of that key is starting or busy; it goes cold when no entry covers
it, when it spans nodes, or when that key's workers keep failing to start. A check of a suite run
needs no entry (PARITY_SUITE_WARM): its environment gets workers on demand (`suite_entry`), so the
suite pays the imports once and a fresh environment is warm for the rest of its suite; they are let
go once idle for PARITY_SUITE_WORKER_IDLE_S. `maintain` runs once per
scheduler tick: it takes back finished orders, retires dead, hung, expiring and idle workers (so an
idle pool shrinks to zero), and starts workers for the attempts waiting, up to each entry's size.

Only one scheduler replica maintains the pool at a time (a transaction-level advisory lock); two
replicas routing at once cannot both place an order with one worker (the order file is created
exclusively, `jobs/pool_folder.py`).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sqlalchemy import or_, select, text, true
from sqlalchemy.orm import Session

from jobs.contract import PhaseName
from jobs.protocol import PHASES, RunPlan
from jobs.rank.dist import job_master_port
from models import Environment, Phase, Run
from models.base import utcnow
from service.core.phase_state import PhaseState
from service.core.pool_config import PoolEntry, entry_for
from service.core.settings import Settings
from service.executors import job_home, job_leases, launcher, pool
from service.runs import import_check

log = logging.getLogger(__name__)
# a key whose worker died before it ever went idle sends its attempts cold for this long
START_FAILURE_COOLDOWN_S = 300.0
_start_failures: dict[PoolKey, float] = {}
POOL_LOCK = 0x70617269  # pg_try_advisory_xact_lock key of the pool maintainer
WAIT = "wait"


# A pool key: (environment id, tasks, GPUs per node). A worker serves the attempts of its key only, so a cuda
# check's attempt goes to a worker that holds one GPU per rank and a cpu check's to one that holds none: CPU and
# GPU never mix (a worker's tasks bind their LOCAL_RANK's device in the attempt child it forks for each order,
# never in the preloading task itself: jobs/rank/attempt.py preload is fork-safe on GPUs).
PoolKey = tuple[int, int, int]


def pool_key(env_id: int, tasks: int, spec: dict[str, Any] | None) -> PoolKey:
    """The key of an attempt of `tasks` ranks on one node of a stored spec: its GPUs are one per rank on cuda."""
    return env_id, tasks, gpus_of(spec, tasks)


def gpus_of(spec: dict[str, Any] | None, tasks: int) -> int:
    """GPUs per node a one-node attempt of `tasks` ranks asks for (0 for a cpu spec; jobs/protocol.py)."""
    if spec is None or spec.get("device", "cpu") == "cpu":
        return 0
    return RunPlan.of(spec).spec.gpus_per_task * tasks


def order_id_of(phase: Phase) -> str:
    """The order id of a phase attempt: fixed by its row, so a placement is found again after a restart."""
    return f"phase-{phase.id}"


# the label every check of a suite run carries (service/suites/runs.py)
SUITE_LABEL = "suite_run"


def suite_entry(settings: Settings, env_name: str, tasks: int, labels: dict[str, str] | None) -> PoolEntry | None:
    """The on-demand pool of a suite run's checks (None for a run outside a suite, or with the feature off)."""
    if not settings.suite_warm or SUITE_LABEL not in (labels or {}):
        return None
    return PoolEntry(env=env_name, tasks=tasks, size=settings.suite_workers, idle_s=float(settings.suite_worker_idle_s),
                     on_demand=True)


def _entry(settings: Settings, env: Environment, tasks: int, labels: dict[str, str] | None) -> PoolEntry | None:
    """PARITY_POOL's entry for this environment and size, else a suite check's on-demand one."""
    entries = settings.pool_entries()
    configured = entry_for(entries, env.name, tasks) if entries else None
    return configured or suite_entry(settings, env.name, tasks, labels)


# how many attempts' pool keys a scheduler remembers across ticks (cleared past that)
KEYS_KEPT = 10_000


@dataclass
class TickWaits:
    """What one scheduler tick learnt while launching: the attempts it left pending for a warm worker
    and the pool keys with no idle worker left this tick.

    With sixteen runs queued on one worker, every tick walked ten waiting attempts, each in its own
    transaction, through the environment lookup and the pool's files only to find the same busy
    worker (a tenth of a core for the scheduler, taken from the jobs), and never looked past the
    tenth: a cold attempt queued behind them waited for the pool to drain. Now the oldest attempt of
    each key is looked at once per tick; once its key is full, the attempts known to share it are
    skipped in the query itself (`skip`), so the pass reaches whatever else is pending."""

    # the pool key (environment id, tasks, GPUs) of each attempt that has waited, owned by the scheduler
    # loop and kept across its ticks (a phase row's key never changes)
    keys: dict[int, PoolKey] = field(default_factory=dict)
    phases: set[int] = field(default_factory=set)
    full_keys: set[PoolKey] = field(default_factory=set)
    # the full keys pooled only for suite checks (no PARITY_POOL entry): a run outside a suite goes cold there
    suite_keys: set[PoolKey] = field(default_factory=set)

    def skip(self) -> set[int]:
        """Phase ids the next launch of this tick need not look at."""
        return self.phases | {pid for pid, key in self.keys.items() if key in self.full_keys}

    def waited(self, phase_id: int, key: PoolKey) -> None:
        self.phases.add(phase_id)
        if len(self.keys) >= KEYS_KEPT:
            self.keys.clear()
        self.keys[phase_id] = key


def route(
    session: Session, phase: Phase, run: Run, *, settings: Settings, executor: str, entry_name: str,
    args: tuple[Any, ...], tasks: int, nodes: int, job_folder: Path,
    hand_over: Callable[[Path], object] = lambda worker: None,
    waits: TickWaits | None = None,
) -> launcher.PhaseJob | str | None:
    """A warm placement of this attempt (its job handle), WAIT (leave it pending), or None (go cold).

    job_folder: the attempt's submitit folder (submitter.launcher_folder), where its tasks' logs go.
    """
    if nodes != 1:
        return None
    key = pool_key(run.environment_id, tasks, run.spec)
    # known pooled for this run, and no idle worker this tick
    full = waits is not None and key in waits.full_keys and (
        key not in waits.suite_keys or SUITE_LABEL in (run.labels or {}))
    entry: PoolEntry | None = None
    if not full:
        env = session.get(Environment, run.environment_id)
        if env is None:
            return None
        entry = _entry(settings, env, tasks, run.labels)
        if entry is None:
            return None
    order_id = order_id_of(phase)
    held = pool.find_order(settings, order_id)
    if held is not None:  # placed by a scheduler that died before recording it: adopt, never place twice
        return _record(phase, held, order_id, job_folder)
    if full:
        if waits is not None:
            waits.waited(phase.id, key)
        return WAIT
    views = [v for v in pool.observe(settings) if v.worker.key == key
             and v.worker.record.get("executor") == executor]
    for v in sorted((v for v in views if v.state == "idle" and not v.expiring), key=lambda v: v.idle_s):
        attempt_job = launcher.PhaseJob(executor=executor, folder=str(job_folder),
                                        job_id=str(v.worker.record["job_id"]), tasks=tasks,
                                        started=v.worker.record.get("started"))
        # fresh rendezvous ports per order: the worker's job id is the same for every order it serves
        order_args = [*args]
        order_args[3] = [job_master_port(str(phase.id), i) for i in range(2)] if entry_name == "attempt" \
            else job_master_port(str(phase.id))
        hand_over(v.worker.files.folder)  # with PARITY_JOB_USER the worker writes them as its own user
        if pool.place(v.worker, order_id, entry_name, order_args, launcher.task_log_files(attempt_job),
                      env=job_home.private_environment(job_folder.parent)):
            log.info("run %s: %s attempt %d to warm worker %s", run.id, phase.name, phase.attempt, v.worker.name)
            return _record(phase, v.worker, order_id, job_folder)
    if time.monotonic() - _start_failures.get(key, float("-inf")) < START_FAILURE_COOLDOWN_S:
        return None
    if waits is not None:
        waits.full_keys.add(key)
        if entry is not None and entry.on_demand:
            waits.suite_keys.add(key)
        waits.waited(phase.id, key)
    return WAIT


def _record(phase: Phase, worker: pool.Worker, order_id: str, job_folder: Path) -> launcher.PhaseJob:
    phase.job_name = pool.warm_name(worker, order_id)
    return launcher.PhaseJob(executor=str(worker.record["executor"]), folder=str(job_folder),
                             job_id=str(worker.record["job_id"]), tasks=worker.tasks,
                             started=worker.record.get("started"))


def maintain(session: Session, *, settings: Settings, executor: str) -> dict[str, int]:
    """Take back finished orders, retire what must go, start what the waiting attempts need."""
    done = {"released": 0, "retired": 0, "started": 0, "swept": 0, "import_failed": 0}
    entries = settings.pool_entries()
    if not entries and not settings.suite_warm and not pool.pool_root(settings).is_dir():
        return done  # no pool configured and no worker left to stop: not even the lock's round trip
    if not session.scalar(text("select pg_try_advisory_xact_lock(:k)"), {"k": POOL_LOCK}):
        return done  # another replica maintains the pool right now
    demand = _demand(session, settings, entries) if entries or settings.suite_warm else Demand()
    views = pool.observe(settings)
    # a fresh build's first worker is its import check: settled before a dead one counts as a start failure
    done["import_failed"] = len(import_check.settle(session, views))
    for v in views:
        if v.state == "busy" and v.order and v.worker.files.finished(v.order, v.worker.tasks):
            pool.release(v.worker, v.order)
            done["released"] += 1
        elif v.state in ("dead", "hung"):
            if _never_ready(v):  # it broke while starting: its attempts go cold for a while, no restart loop
                _start_failures[v.worker.key] = time.monotonic()
            pool.retire(v.worker, f"worker {v.state}", hard=True)
            done["retired"] += 1
        elif v.state == "starting" and v.age_s > settings.pending_timeout_s:
            _start_failures[v.worker.key] = time.monotonic()
            pool.retire(v.worker, "never became ready", hard=True)
            done["retired"] += 1
        elif v.state == "idle" and _let_go(v, entries, demand):
            pool.retire(v.worker, "expiring" if v.expiring else "idle", hard=False)
            done["retired"] += 1
    if demand.entries:
        done["started"] = _grow(settings, executor, demand)
    done["swept"] = pool.sweep_retired(settings)
    return done


def _never_ready(v: pool.WorkerView) -> bool:
    beats = v.worker.files.beats(v.worker.tasks)
    return not any(b is not None and b.get("state") in ("idle", "busy") for b in beats) and v.order is None


def _entry_of(entries: tuple[PoolEntry, ...], v: pool.WorkerView) -> PoolEntry | None:
    return entry_for(entries, str(v.worker.record.get("env_name")), v.worker.tasks)


def _let_go(v: pool.WorkerView, entries: tuple[PoolEntry, ...], demand: Demand) -> bool:
    """Whether an idle worker goes: expiring, idle past its time, or its PARITY_POOL entry gone. A suite's
    on-demand worker stays while attempts of its key wait (a resharded resume's 1-rank worker, started when
    that resume turned pending, waits out the local executor's slot for it rather than importing twice)."""
    if v.expiring:
        return True
    idle_past = v.idle_s > float(v.worker.record.get("idle_s", 300))
    if v.worker.record.get("on_demand"):
        return idle_past and not demand.wants(v.worker.key)
    return idle_past or _entry_of(entries, v) is None


@dataclass
class Demand:
    """The pending attempts of each pooled key (environment id, tasks, GPUs), its environment and its entry; and
    the keys a suite's checks will need next (`soon`: a resharded resume, its own job at another size)."""

    waiting: Counter[PoolKey] = field(default_factory=Counter)
    soon: set[PoolKey] = field(default_factory=set)
    envs: dict[int, Environment] = field(default_factory=dict)
    entries: dict[PoolKey, PoolEntry] = field(default_factory=dict)

    def add(self, env: Environment, tasks: int, entry: PoolEntry, *, pending: bool, gpus: int = 0) -> None:
        key = (env.id, tasks, gpus)
        if pending:
            self.waiting[key] += 1
        else:
            self.soon.add(key)
        self.envs[env.id] = env
        self.entries.setdefault(key, entry)

    def wants(self, key: PoolKey) -> bool:
        return key in self.waiting or key in self.soon


def _demand(session: Session, settings: Settings, entries: tuple[PoolEntry, ...]) -> Demand:
    """What the pending attempts of pooled keys (configured, or a suite's) ask of the pool, and what a suite's
    train_and_save attempts (pending or in flight) will ask next: their resume when it is a job of its own at
    another world size, so that worker imports while the suite's other checks run, not after the save."""
    now = utcnow()
    pending = Phase.state == PhaseState.PENDING.value
    rows = session.execute(
        select(Phase.name, pending, Run.spec, Run.labels, Environment).join(Run, Run.id == Phase.run_id)
        .join(Environment, Environment.id == Run.environment_id)
        .where(or_(pending & or_(Phase.not_before.is_(None), Phase.not_before <= now),
                   Phase.state.in_([PhaseState.SUBMITTED.value, PhaseState.RUNNING.value])
                   & (Phase.name == PHASES[0]) & Run.labels.has_key(SUITE_LABEL)),
               true() if entries else Run.labels.has_key(SUITE_LABEL))  # only suites can be pooled then
    ).tuples().all()
    demand = Demand()
    for name, waiting, spec, labels, env in rows:
        plan = RunPlan.of(spec)
        if plan.nodes != 1:
            continue
        tasks = plan.tasks(cast(PhaseName, name))
        entry = entry_for(entries, env.name, tasks) or suite_entry(settings, env.name, tasks, labels)
        if waiting and entry is not None:
            demand.add(env, tasks, entry, pending=True, gpus=gpus_of(spec, tasks))
        later = plan.tasks(PHASES[1])
        if name == PHASES[0] and not plan.forks_resume(name) and later != tasks:
            entry = entry_for(entries, env.name, later) or suite_entry(settings, env.name, later, labels)
            if entry is not None and entry.on_demand:
                demand.add(env, later, entry, pending=False, gpus=gpus_of(spec, later))
    return demand


IMPORTS_AT_ONCE = max(1, (os.cpu_count() or 2) // 4)  # workers of one key importing at once


def _grow(settings: Settings, executor: str, demand: Demand) -> int:
    """Start workers for the pending attempts of each pooled key, up to its entry's size."""
    views = pool.observe(settings)
    live = [v for v in views if v.state in ("starting", "idle", "busy") and v.worker.record.get("executor") == executor]
    importing = {v.worker.key[0] for v in views if v.state == "starting"}  # environments a worker imports now
    started = 0
    # the keys attempts wait for first: a key wanted only soon then sees the workers started for them
    for key in sorted(demand.entries, key=lambda key: (key not in demand.waiting, key)):
        env_id, _, gpus = key
        env, entry = demand.envs[env_id], demand.entries[key]
        waiting = demand.waiting[key] or 1  # a key wanted soon: one worker
        if env.state != "ready":
            continue
        if time.monotonic() - _start_failures.get(key, float("-inf")) < START_FAILURE_COOLDOWN_S:
            continue
        mine = [v for v in live if v.worker.key == key]
        if not demand.waiting[key] and env_id in importing:
            # wanted only soon (a resharded resume): it imports once the suite's first worker is up, never
            # beside it, where it slowed the imports every check waits for (and then idled past its backstop)
            continue
        free = sum(v.state in ("starting", "idle") and not v.expiring for v in mine)
        # few workers of a key import at once (one per 4 CPUs): two importing torch and Megatron-Core side by side
        # on 2 cores made the suite's first check wait for both (7.8 s -> 13.5 s); the next starts once one is up,
        # beside the first check
        room = IMPORTS_AT_ONCE - sum(v.state == "starting" for v in mine)
        for _ in range(max(0, min(entry.size - len(mine), waiting - free, room))):
            try:
                pool.start_worker(settings, executor, env_id=env_id, env_name=env.name, python=env.python,
                                  entry=entry, gpus=gpus)
            except job_leases.NoFreeJobUser as exc:  # every job user serves a live job: start it later
                log.info("pool: no worker started now: %s", exc)
                return started
            started += 1
            importing.add(env_id)
    return started


def pool_summary(settings: Settings) -> dict[str, Any]:
    """Workers by state, from their folders only (no sacct): what /healthz and the dashboard show."""
    views = [pool.view(settings, w, None) for w in pool.list_workers(settings)]
    counts = Counter(v.state for v in views)
    return {
        "configured": settings.pool,
        "workers": len(views), "busy": counts["busy"], "idle": counts["idle"], "starting": counts["starting"],
        "unhealthy": counts["hung"] + counts["dead"],
        "oldest_age_s": round(max((v.age_s for v in views), default=0.0), 1),
        "list": [v.public() for v in views],
    }
