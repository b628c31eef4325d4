"""The warm pool's workers as the scheduler sees them: start, observe, hand an order, take it back, retire.

A worker is one job submitted like any phase (`launcher.submit_phase`: one Slurm job, or one local
process group) whose tasks run `jobs.launch.pool_worker.serve`; its folder (`jobs/pool_folder.py`)
is the whole interface. What the worker writes (heartbeats, done reports) is read as bounded JSON,
never unpickled. The database knows a warm attempt by its phase's job name, `pool:<worker>:<order>`;
the worker's job id is the phase's job id, so Slurm's and the local executor's states apply as for a
cold job.

The database-facing half (which phase goes to which worker, how many workers to keep) is
service/runs/pool_dispatch.py.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.pool_folder import PoolFolder, read_pool_file, write_atomic
from service.core.pool_config import PoolEntry
from service.core.settings import Settings
from service.executors import job_leases, job_user, launcher

log = logging.getLogger(__name__)
WARM_PREFIX = "pool:"
# a retired worker's folder (its job's own logs) is kept this long after its job ended
RETIRED_KEEP_S = 600.0
# a worker stops taking orders once less than this share of its time limit is left
EXPIRING_SHARE = 0.5


def pool_root(settings: Settings) -> Path:
    """Where the workers' folders live (under the run folder, which every node sees)."""
    return settings.resolved_run_folder / "pool"


@dataclass(frozen=True)
class Worker:
    """One worker's folder and the scheduler's record of it."""

    files: PoolFolder
    record: dict[str, Any]

    @property
    def name(self) -> str:
        return self.files.name

    @property
    def tasks(self) -> int:
        return int(self.record["tasks"])

    @property
    def key(self) -> tuple[int, int, int]:
        """(environment id, tasks, GPUs per node): the attempts this worker may serve (a worker that holds no
        GPU serves cpu checks only, one that holds a GPU per rank cuda checks only)."""
        return int(self.record["env_id"]), self.tasks, int(self.record.get("gpus") or 0)

    def job(self) -> launcher.PhaseJob:
        """The worker's own job, as the launcher polls and cancels it."""
        return launcher.PhaseJob(executor=str(self.record["executor"]), folder=str(self.files.submitit),
                                 job_id=str(self.record.get("job_id") or ""), tasks=self.tasks,
                                 started=self.record.get("started"))


@dataclass(frozen=True)
class WorkerView:
    """A worker's state now: starting, idle, busy, hung, dead or retired; its order; ages."""

    worker: Worker
    state: str
    order: str | None
    age_s: float
    idle_s: float
    expiring: bool

    def public(self) -> dict[str, Any]:
        """What /healthz, /metrics and the dashboard show of it."""
        rec = self.worker.record
        return {"name": self.worker.name, "environment": rec.get("env_name"), "environment_id": rec.get("env_id"),
                "tasks": self.worker.tasks, "gpus": self.worker.key[2], "executor": rec.get("executor"),
                "job_id": rec.get("job_id"),
                "state": self.state, "order": self.order, "age_s": round(self.age_s, 1),
                "idle_s": round(self.idle_s, 1), "expiring": self.expiring}


def list_workers(settings: Settings, *, retired: bool = False) -> list[Worker]:
    """Every worker with a record (the retired ones only when asked)."""
    root = pool_root(settings)
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(root.iterdir()):
        files = PoolFolder(folder)
        record = read_pool_file(files.record) if folder.is_dir() else None
        if record is None or "env_id" not in record or "tasks" not in record:
            continue
        if files.retired.exists() and not retired:
            continue
        out.append(Worker(files, record))
    return out


def _life_s(settings: Settings, executor: str) -> float:
    return 60.0 * (settings.slurm_time_limit_min if executor == "slurm" else settings.phase_timeout_min)


def view(settings: Settings, worker: Worker, job: launcher.JobStatus | None, now: float | None = None) -> WorkerView:
    """The state of one worker from its files (and, when given, its job's state)."""
    now = now or time.time()
    age = now - float(worker.record.get("created", now))
    expiring = age > EXPIRING_SHARE * _life_s(settings, str(worker.record.get("executor")))
    files = worker.files
    order = files.read_order()
    order_id = None if order is None else str(order.get("id"))
    beats = files.beats(worker.tasks)
    ages = [files.beat_age(rank, now) for rank in range(worker.tasks)]
    hang_s = float(worker.record.get("hang_s", 30.0))

    def made(state: str, idle: float = 0.0) -> WorkerView:
        return WorkerView(worker, state, order_id, age, idle, expiring)

    if files.retired.exists():
        return made("retired")
    if job is not None and job.kind in ("done", "failed", "infra"):
        return made("dead")
    if any(a is not None and a > hang_s for a in ages):
        return made("hung")
    if any(b is None or b.get("state") == "starting" for b in beats):
        return made("starting")
    if order is not None:
        return made("busy")
    if all(b is not None and b.get("state") == "idle" for b in beats):
        since = max(float(b.get("since", now)) for b in beats if b is not None)
        return made("idle", max(0.0, now - since))
    return made("starting")  # between states (an order just taken back): not idle yet


def observe(settings: Settings) -> list[WorkerView]:
    """Every live worker's state, its job polled through the launcher (one shared sacct)."""
    workers = list_workers(settings)
    statuses = launcher.poll([w.job() for w in workers if w.record.get("job_id")])
    return [view(settings, w, statuses.get(w.job())) for w in workers]


def job_tag(settings: Settings) -> str:
    """This installation's tag in job names (a hash of the run folder, as the phases' job names use)."""
    return hashlib.sha1(str(settings.resolved_run_folder.resolve()).encode()).hexdigest()[:8]


def start_worker(settings: Settings, executor: str, *, env_id: int, env_name: str, python: str,
                 entry: PoolEntry, gpus: int = 0) -> Worker:
    """Submit one worker for an environment and world size, holding `gpus` GPUs per node (one per rank for cuda
    checks, none for cpu ones); its record is written before the job exists."""
    from jobs.launch.pool_worker import serve

    name = f"e{env_id}-t{entry.tasks}{f'-g{gpus}' if gpus else ''}-{uuid.uuid4().hex[:10]}"
    files = PoolFolder(pool_root(settings) / name)
    job_user.prepare_tree(settings.resolved_run_folder, files.submitit, job_user.job_user(settings.job_user))
    # the worker's own user, for its whole life (every attempt it serves writes as it): leased before its
    # record exists, so a full pool of users leaves nothing behind (NoFreeJobUser)
    job_leases.lease(settings, files.folder)
    record: dict[str, Any] = {"env_id": env_id, "env_name": env_name, "tasks": entry.tasks, "executor": executor,
                              "job_id": None, "started": None, "created": time.time(), "hang_s": entry.hang_s,
                              "idle_s": entry.idle_s, "on_demand": entry.on_demand, "gpus": gpus}
    write_atomic(files.record, record)
    job = launcher.submit_phase(launcher.JobRequest(
        executor=executor, folder=files.submitit, python=python, tasks=entry.tasks,
        name=f"parity-{job_tag(settings)}-pool-{name}", function=serve, args=(str(files.folder), entry.idle_s),
        gpus_per_node=gpus,
    ), settings)
    record.update(job_id=job.job_id, started=job.started)
    write_atomic(files.record, record)
    log.info("pool: started worker %s for environment %s (%d tasks) as %s job %s", name, env_name, entry.tasks,
             executor, job.job_id)
    return Worker(files, record)


def place(worker: Worker, order_id: str, entry: str, args: list[Any], logs: list[tuple[str, str]],
          env: dict[str, str] | None = None) -> bool:
    """Hand `worker` an attempt (exclusive: False when it already holds an order); `env`: the attempt child's
    own variables (its private HOME, TMPDIR and caches inside the attempt's folder)."""
    return worker.files.place_order({"id": order_id, "kind": "attempt", "entry": entry, "args": args,
                                     "logs": [list(pair) for pair in logs], "env": dict(env or {})})


def find_order(settings: Settings, order_id: str) -> Worker | None:
    """The live worker holding `order_id` (a placement the database never recorded), if any."""
    for worker in list_workers(settings):
        order = worker.files.read_order()
        if order is not None and order.get("id") == order_id:
            return worker
    return None


def awaited_reports(settings: Settings) -> list[Path]:
    """What the scheduler's wait watches of the workers: the done reports of those holding an order, and the
    import reports of those still importing (a new environment's first worker is its import check, and the
    suite's first check is placed once it has settled)."""
    out = []
    for w in list_workers(settings):
        if w.files.read_order() is not None:
            out += [w.files.done(rank) for rank in range(w.tasks)]
        out += [w.files.imported(rank) for rank in range(w.tasks)]  # the wait watches only those not yet there
    return out


def warm_name(worker: Worker, order_id: str) -> str:
    """The job name a warm phase is recorded under."""
    return f"{WARM_PREFIX}{worker.name}:{order_id}"


def is_warm(job_name: str | None) -> bool:
    """Whether a phase ran (or runs) on a pool worker."""
    return bool(job_name) and str(job_name).startswith(WARM_PREFIX)


def _named(settings: Settings, job_name: str) -> tuple[PoolFolder, str]:
    _, name, order_id = job_name.split(":", 2)
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"job name {job_name!r} names no pool worker")
    return PoolFolder(pool_root(settings) / name), order_id


def warm_status(settings: Settings, job_name: str, job: launcher.JobStatus) -> launcher.JobStatus:
    """The state of a warm attempt: the worker's job's, unless the worker died, hung, or let the order go.

    A worker whose allocation ended, or whose task stopped beating, is an infrastructure failure (the
    attempt is retried like a cancelled Slurm job); an order whose attempt children all exited is a
    job that ended (its documents, or their absence, say the rest, exactly as for a cold job).
    """
    files, order_id = _named(settings, job_name)
    record = read_pool_file(files.record)
    if record is None:
        return launcher.JobStatus(kind="infra", raw="WORKER_GONE")
    if job.kind in ("done", "failed", "infra"):
        return launcher.JobStatus(kind="infra", raw=f"WORKER_{job.raw}")
    tasks = int(record.get("tasks", 1))
    order = files.read_order()
    if order is None or order.get("id") != order_id or files.finished(order_id, tasks):
        return launcher.JobStatus(kind="failed", raw="ORDER_ENDED")
    hang_s = float(record.get("hang_s", 30.0))
    if any(a is None or a > hang_s for a in (files.beat_age(r) for r in range(tasks))):
        return launcher.JobStatus(kind="infra", raw="WORKER_HUNG")
    return launcher.JobStatus(kind="running", raw="RUNNING")


def cancel_warm(settings: Settings, job_name: str) -> None:
    """Ask the worker to kill the order's attempt children; it then reports done and goes back to idle."""
    files, order_id = _named(settings, job_name)
    if files.folder.is_dir():
        write_atomic(files.cancel, {"order": order_id})


def retire_named(settings: Settings, job_name: str, reason: str) -> None:
    """Stop the worker a warm phase ran on, at once (it died, hung or ran out of time)."""
    files, _ = _named(settings, job_name)
    record = read_pool_file(files.record)
    if record is not None:
        retire(Worker(files, record), reason, hard=True)


def retire(worker: Worker, reason: str, *, hard: bool) -> None:
    """Never hand the worker another order, and stop it: a stop order when idle, else its job is cancelled."""
    first = not worker.files.retired.exists()
    worker.files.retired.write_text(reason[:500])
    if first:
        log.info("pool: retiring worker %s (%s)", worker.name, reason)
    stopped = not hard and worker.files.place_order({"id": f"stop-{uuid.uuid4().hex[:8]}", "kind": "stop"})
    if not stopped and worker.record.get("job_id"):
        launcher.cancel(worker.job())


def release(worker: Worker, order_id: str) -> None:
    """Take back an order whose attempt children have all exited: the worker reads idle again."""
    worker.files.clear_order(order_id, worker.tasks)


def end_worker(settings: Settings, worker: Worker) -> None:
    """A retired worker's job has ended: kill what it (or an attempt it served) left running, and give
    its user back to the pool (its folder stays the worker's until it is deleted, root's to delete)."""
    if not job_leases.leased(settings, worker.files.folder):
        return
    launcher.end_job(worker.job(), settings)
    job_leases.release(settings, worker.files.folder)


def sweep_retired(settings: Settings) -> int:
    """Delete the folders of retired workers whose job has ended a while ago; how many."""
    gone = 0
    retired = [w for w in list_workers(settings, retired=True) if w.files.retired.exists()]
    if not retired:
        return 0
    statuses = launcher.poll([w.job() for w in retired if w.record.get("job_id")])
    for worker in retired:
        status = statuses.get(worker.job())
        ended = status is None or status.kind in ("done", "failed", "infra")
        if ended:
            end_worker(settings, worker)
        if ended and time.time() - worker.files.retired.stat().st_mtime > RETIRED_KEEP_S:
            shutil.rmtree(worker.files.folder, ignore_errors=True)
            worker.files.record.unlink(missing_ok=True)
            worker.files.retired.unlink(missing_ok=True)
            gone += 1
    return gone
