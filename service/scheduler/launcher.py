"""Submitit on one side, plain (folder, job id) on the other: submit, find, re-attach, poll, fetch, cancel.

Slurm jobs are submitted with --no-requeue (a preempted or failed node must not start a second copy
of an attempt behind our back; the scheduler retries as a new attempt in a new folder) and a job
name that names run, phase and attempt, so a job whose submission was cut short can be found again.
Local jobs run their submitit controller in a session of its own: the controller and its ranks form
one process group that can be killed as a whole, also by a scheduler that restarted. A local job is
identified by its pid and that process's start time, so a reused pid is never taken for it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import submitit
from submitit.core.core import Job
from submitit.local import local as submitit_local

from jobs.documents import merge_rank_documents
from service.settings import Settings

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
# Fault hook for tests: exit right after sbatch returned, before submitit names the job's pickle.
FAULT_AFTER_SBATCH = "PARITY_FAULT_EXIT_AFTER_SBATCH"

# Slurm states that mean the infrastructure, not the code under test, stopped the phase.
INFRA_STATES = frozenset(
    {"CANCELLED", "NODE_FAIL", "PREEMPTED", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "LOST"}
)
# Slurm states of a job that is not over yet (squeue still lists it).
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"})


@dataclass(frozen=True)
class PhaseJob:
    """What the database keeps about one submitted phase."""

    executor: str
    folder: str
    job_id: str
    tasks: int
    # local jobs: the controller's start time (psutil create_time)
    started: float | None = None


@dataclass(frozen=True)
class JobStatus:
    """A normalised state: active, running, done, failed (job raised), infra (killed from outside)."""

    kind: str
    raw: str


# scancel's answers for a job that has already ended (nothing left to cancel)
_GONE = re.compile(r"already completing or completed|Invalid job id", re.I)

# Local jobs are children of this process: keep their Popen handles so they get reaped.
_LOCAL_JOBS: dict[str, Job[Any]] = {}


class _SlurmExecutor(submitit.SlurmExecutor):
    def _submit_command(self, command: str) -> Job[Any]:
        job = super()._submit_command(command)
        if os.environ.get(FAULT_AFTER_SBATCH) == "1":
            log.error("fault hook %s: exiting after sbatch gave job %s", FAULT_AFTER_SBATCH, job.job_id)
            os._exit(70)
        return job


class _LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, with the controller started as the leader of its own session."""

    def _submit_command(self, command: str) -> submitit_local.LocalJob[Any]:
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = dict(os.environ)
        env.update(
            SUBMITIT_LOCAL_NTASKS=str(ntasks), SUBMITIT_LOCAL_COMMAND=command,
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 2.0))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S="30", SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="", SUBMITIT_EXECUTOR="local", CUDA_VISIBLE_DEVICES="",
            SUBMITIT_LOCAL_WITH_SHELL="",
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "submitit.local._local", str(self.folder)], env=env, start_new_session=True,
        )
        return submitit_local.LocalJob(folder=self.folder, job_id=str(process.pid), process=process,
                                       tasks=list(range(ntasks)))


def _pythonpath() -> str:
    # Put this checkout's jobs package on the path, so an environment needs only torch + Megatron-Core.
    current = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) in current.split(os.pathsep):
        return current
    return os.pathsep.join(filter(None, [str(REPO_ROOT), current]))


def submit_phase(
    *, executor: str, folder: Path, python: str, tasks: int, settings: Settings, name: str,
    function: Any, args: tuple[Any, ...],
) -> PhaseJob:
    """Submit function(*args) as one job of `tasks` ranks named `name`; return its handle."""
    folder.mkdir(parents=True, exist_ok=True)
    pythonpath = _pythonpath()
    ex: submitit.Executor
    if executor == "slurm":
        ex = _SlurmExecutor(folder=folder, python=python, max_num_timeout=0)
        params: dict[str, Any] = dict(
            ntasks_per_node=tasks, nodes=1, cpus_per_task=settings.slurm_cpus_per_task,
            time=settings.slurm_time_limit_min, job_name=name, setup=[f"export PYTHONPATH={pythonpath}"],
            additional_parameters={**settings.sbatch_extra(), "no-requeue": True},
        )
        if settings.slurm_partition:
            params["partition"] = settings.slurm_partition
        ex.update_parameters(**params)
    elif executor == "local":
        ex = _LocalExecutor(folder=folder, python=python, max_num_timeout=0)
        ex.update_parameters(tasks_per_node=tasks, timeout_min=settings.phase_timeout_min)
        os.environ["PYTHONPATH"] = pythonpath
    else:
        raise ValueError(f"executor: {executor!r} is not one of slurm, local")
    job = ex.submit(function, *args)
    started = None
    if executor == "local":
        _LOCAL_JOBS[job.job_id] = job
        started = psutil.Process(int(job.job_id)).create_time()
    log.info("submitted %s as %s job %s in %s", name, executor, job.job_id, folder)
    return PhaseJob(executor=executor, folder=str(folder), job_id=str(job.job_id), tasks=tasks, started=started)


def find_submitted(folder: Path) -> str | None:
    """The job id already submitted from folder (submitit leaves <id>_submitted.pkl), if any."""
    if not folder.is_dir():
        return None
    ids = sorted(p.name[: -len("_submitted.pkl")] for p in folder.glob("*_submitted.pkl"))
    return ids[-1] if ids else None


def _stray_pickles(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("*.pkl") if not p.name.endswith(("_submitted.pkl", "_result.pkl"))]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def interrupted_submission(folder: Path) -> bool:
    """Whether a submission from folder may have reached sbatch without being recorded.

    submitit dumps the call to `<uuid>.pkl` before sbatch and renames it to `<id>_submitted.pkl`
    after; a stray `<uuid>.pkl` is the only trace of a submitter that died in between.
    """
    return bool(_stray_pickles(folder))


def find_slurm_job(name: str, since: datetime) -> tuple[str, str] | None:
    """(job id, state) of the newest Slurm job named `name` submitted since `since`, if any."""
    start = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # sacct reads local time
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", f"--name={name}", "-S", start, "-o", "JobID,State"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    rows = [line.split("|") for line in out.stdout.splitlines() if "|" in line]
    queued = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i|%T"], capture_output=True, text=True,
                            timeout=60, check=True)
    # squeue knows a job sacct has not recorded yet; sacct knows jobs that already ended
    rows += [line.split("|") for line in queued.stdout.splitlines() if "|" in line]
    found = sorted({(int(j), s.split()[0]) for j, s in rows if j.isdigit()})
    return (str(found[-1][0]), found[-1][1]) if found else None


def adopt_slurm_job(folder: Path, job_id: str) -> None:
    """Finish a submission cut short after sbatch: give the job its pickle under its job id.

    submitit dumps the call to `<uuid>.pkl`, runs sbatch, then renames it to `<id>_submitted.pkl`;
    the job waits up to a minute for that name. A scheduler killed in between leaves the uuid file.
    """
    target = folder / f"{job_id}_submitted.pkl"
    if target.exists():
        return
    pending = _stray_pickles(folder)
    if pending:
        pending[-1].rename(target)
        log.info("adopted Slurm job %s: moved %s to %s", job_id, pending[-1].name, target.name)


def _job(job: PhaseJob) -> Job[Any]:
    if job.executor == "local":
        return _LOCAL_JOBS.get(job.job_id) or submitit.LocalJob(job.folder, job.job_id, tasks=range(job.tasks))
    return submitit.SlurmJob(job.folder, job.job_id, tasks=range(job.tasks))


def local_process(job: PhaseJob) -> psutil.Process | None:
    """The live controller process of a local job: same pid and same start time, else None.

    Without a recorded start time the pid alone proves nothing (it may have been reused), and a
    process we cannot prove is ours is never signalled.
    """
    if job.started is None:
        return None
    try:
        proc = psutil.Process(int(job.job_id))
        if proc.status() == psutil.STATUS_ZOMBIE or abs(proc.create_time() - job.started) > 0.01:
            return None  # gone, or the pid now belongs to another process
        return proc
    except (psutil.NoSuchProcess, ValueError):
        return None


def _status(spec: PhaseJob) -> JobStatus:
    handle = _job(spec)
    if spec.executor == "local" and spec.job_id not in _LOCAL_JOBS:
        # re-attached after a restart: no Popen handle, so judge by the process and the result file
        if handle.paths.result_pickle.exists():
            raw = "FINISHED"
        elif local_process(spec) is not None:
            raw = "RUNNING"
        else:
            raw = "LOST"
    else:
        raw = str(handle.state).split()[0].upper() if handle.state else "UNKNOWN"
    return JobStatus(kind=_kind(raw), raw=raw)


def poll(jobs: list[PhaseJob]) -> dict[PhaseJob, JobStatus]:
    """States of many jobs; Slurm jobs share one sacct call through submitit's watcher."""
    out: dict[PhaseJob, JobStatus] = {}
    for spec in jobs:
        try:
            out[spec] = _status(spec)
        except Exception as exc:  # one odd job must not hide every other job's state
            log.warning("polling %s job %s: %s", spec.executor, spec.job_id, exc)
            out[spec] = JobStatus(kind="active", raw="UNKNOWN")
    return out


def _kind(raw: str) -> str:
    if raw in ("COMPLETED", "FINISHED"):
        return "done"
    if raw == "RUNNING":
        return "running"
    if raw in INFRA_STATES or raw.startswith("CANCELLED"):
        return "infra"
    if raw == "FAILED" or raw == "INTERRUPTED":
        return "failed"
    return "active"


def fetch_result(job: PhaseJob) -> tuple[dict[str, Any] | None, str | None]:
    """(the phase's document, None) or (None, the error of a job whose ranks all raised or vanished).

    Every rank's document is read: when one rank fails, its own error is the root cause, not the
    "connection reset" its peers saw.
    """
    handle = _job(job)
    docs, errors = [], []
    for task in range(job.tasks):
        try:
            docs.append(handle.task(task).result())
        except Exception as exc:  # submitit wraps the remote traceback in the exception text
            errors.append(f"rank {task}: {type(exc).__name__}: {exc}"[-8000:])
    merged = merge_rank_documents([d for d in docs if isinstance(d, dict)])
    if merged is not None:
        return merged, None
    return None, "\n".join(errors) or "no rank returned a result"


def cancel(job: PhaseJob) -> None:
    """Ask the executor to stop a job: scancel, or SIGTERM then SIGKILL to a local job's process group.

    Raises when the request could not be made (scancel failed): the caller asks again; only a
    later `poll` that sees the job ended confirms it is gone.
    """
    if job.executor == "slurm":
        out = subprocess.run(["scancel", job.job_id], capture_output=True, text=True, timeout=60)
        if out.returncode != 0 and not _GONE.search(out.stderr):
            raise RuntimeError(f"scancel {job.job_id}: {out.stderr.strip() or out.returncode}")
        return
    proc = local_process(job)
    if proc is None:
        return
    pgid = os.getpgid(proc.pid)
    if pgid != proc.pid:  # not a controller we started in its own session: never signal a stranger's group
        raise RuntimeError(f"local job {job.job_id} does not lead its process group ({pgid})")
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    local = _LOCAL_JOBS.get(job.job_id)
    if local is not None:
        local._process.wait(timeout=10)  # type: ignore[attr-defined]  # reap our child


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(p.info["status"] != psutil.STATUS_ZOMBIE
               for p in psutil.process_iter(["status"]) if _pgid(p.pid) == pgid)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def log_paths(job: PhaseJob) -> list[str]:
    """stdout/stderr files of every rank of a job."""
    handle = _job(job)
    paths = []
    for task in range(job.tasks):
        sub = handle.task(task)
        paths += [str(sub.paths.stdout), str(sub.paths.stderr)]
    return paths
