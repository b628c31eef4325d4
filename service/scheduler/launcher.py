"""Submitit on one side, plain (folder, job id) on the other: submit, re-attach, poll, fetch, cancel."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psutil
import submitit
from submitit.core.core import Job

from jobs.contract import PhaseDocument
from jobs.documents import merge_rank_documents
from service.settings import Settings

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]

# Slurm states that mean the infrastructure, not the code under test, stopped the phase.
INFRA_STATES = frozenset(
    {"CANCELLED", "NODE_FAIL", "PREEMPTED", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "LOST"}
)


@dataclass(frozen=True)
class PhaseJob:
    """What the database keeps about one submitted phase."""

    executor: str
    folder: str
    job_id: str
    tasks: int


@dataclass(frozen=True)
class JobStatus:
    """A normalised state: active, running, done, failed (job raised), infra (killed from outside)."""

    kind: str
    raw: str


# Local jobs are children of this process: keep their Popen handles so they get reaped.
_LOCAL_JOBS: dict[str, Job[Any]] = {}


def submit_phase(
    *, executor: str, folder: Path, python: str, tasks: int, settings: Settings, name: str,
    function: Any, args: tuple[Any, ...],
) -> PhaseJob:
    """Submit function(*args) as one job of `tasks` ranks; return its (folder, job id)."""
    folder.mkdir(parents=True, exist_ok=True)
    timeout = settings.phase_timeout_min if executor == "local" else settings.slurm_time_limit_min
    # Put this checkout's jobs package on the path, so an environment needs only torch + Megatron-Core.
    current = os.environ.get("PYTHONPATH", "")
    pythonpath = current if str(REPO_ROOT) in current.split(os.pathsep) else os.pathsep.join(
        filter(None, [str(REPO_ROOT), current])
    )
    ex: submitit.Executor
    if executor == "slurm":
        ex = submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=0)
        params: dict[str, Any] = dict(
            ntasks_per_node=tasks, nodes=1, cpus_per_task=settings.slurm_cpus_per_task, time=timeout,
            job_name=name, setup=[f"export PYTHONPATH={pythonpath}"],
        )
        if settings.slurm_partition:
            params["partition"] = settings.slurm_partition
        if settings.sbatch_extra():
            params["additional_parameters"] = settings.sbatch_extra()
        ex.update_parameters(**params)
    else:
        ex = submitit.LocalExecutor(folder=folder, python=python, max_num_timeout=0)
        ex.update_parameters(tasks_per_node=tasks, timeout_min=timeout)
        os.environ["PYTHONPATH"] = pythonpath
    job = ex.submit(function, *args)
    if executor == "local":
        _LOCAL_JOBS[job.job_id] = job
    log.info("submitted %s as %s job %s in %s", name, executor, job.job_id, folder)
    return PhaseJob(executor=executor, folder=str(folder), job_id=str(job.job_id), tasks=tasks)


def find_submitted(folder: Path) -> str | None:
    """The job id already submitted from folder (submitit leaves <id>_submitted.pkl), if any."""
    if not folder.is_dir():
        return None
    ids = sorted(p.name[: -len("_submitted.pkl")] for p in folder.glob("*_submitted.pkl"))
    return ids[-1] if ids else None


def _submitit_job(job: PhaseJob) -> Job[Any]:
    if job.executor == "local":
        return _LOCAL_JOBS.get(job.job_id) or submitit.LocalJob(job.folder, job.job_id, tasks=range(job.tasks))
    return submitit.SlurmJob(job.folder, job.job_id, tasks=range(job.tasks))


def _local_pid_alive(job_id: str) -> bool:
    try:
        return psutil.Process(int(job_id)).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):
        return False


def poll(jobs: list[PhaseJob]) -> dict[PhaseJob, JobStatus]:
    """States of many jobs; Slurm jobs share one sacct call through submitit's watcher."""
    handles = {j: _submitit_job(j) for j in jobs}
    out: dict[PhaseJob, JobStatus] = {}
    for spec, handle in handles.items():
        raw = str(handle.state).split()[0].upper() if handle.state else "UNKNOWN"
        if spec.executor == "local" and spec.job_id not in _LOCAL_JOBS:
            # re-attached after a restart: no Popen handle, so judge by the pid and the result file
            if handle.paths.result_pickle.exists():
                raw = "FINISHED"
            elif _local_pid_alive(spec.job_id):
                raw = "RUNNING"
            else:
                raw = "LOST"
        out[spec] = JobStatus(kind=_kind(raw), raw=raw)
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


def fetch_result(job: PhaseJob) -> tuple[PhaseDocument | None, str | None]:
    """(the phase's document, None) or (None, the error of a job whose ranks all raised or vanished).

    Every rank's document is read: when one rank fails, its own error is the root cause, not the
    "connection reset" its peers saw.
    """
    handle = _submitit_job(job)
    docs, errors = [], []
    for task in range(job.tasks):
        try:
            docs.append(handle.task(task).result())
        except Exception as exc:  # submitit wraps the remote traceback in the exception text
            errors.append(f"rank {task}: {type(exc).__name__}: {exc}"[-8000:])
    # unvalidated here: the reconciler validates what it ingests
    merged = merge_rank_documents(cast(list[PhaseDocument], [d for d in docs if isinstance(d, dict)]))
    if merged is not None:
        return merged, None
    return None, "\n".join(errors) or "no rank returned a result"


def cancel(job: PhaseJob) -> None:
    """Ask the executor to stop a job (scancel, or SIGTERM to the local controller)."""
    try:
        _submitit_job(job).cancel(check=False)
    except Exception as exc:  # already gone: nothing to cancel
        log.warning("cancel of %s job %s: %s", job.executor, job.job_id, exc)


def log_paths(job: PhaseJob) -> list[str]:
    """stdout/stderr files of every rank of a job."""
    handle = _submitit_job(job)
    paths = []
    for task in range(job.tasks):
        sub = handle.task(task)
        paths += [str(sub.paths.stdout), str(sub.paths.stderr)]
    return paths
