"""Submitit on one side, plain (folder, job id) on the other: submit, re-attach, poll, fetch, cancel."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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


# What a job may see of the scheduler's environment: the code under test must never get the
# database URL (with its password), API tokens or cloud credentials. Names listed exactly, or by prefix.
JOB_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "PYTHONPATH",
    "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "SLURM_CONF",
    # job-side knobs read by jobs/ (fault injection in tests, checkpoint save manager, fast exit)
    "PARITY_INJECT_FAULT", "PARITY_SAVE_MANAGER_QUEUE", "PARITY_FAST_EXIT",
})
JOB_ENV_PREFIXES = ("LC_", "SLURM_", "SUBMITIT_", "OMP_", "MKL_", "NCCL_", "GLOO_", "TORCH_")
_ENV_LOCK = threading.Lock()


def job_environment(environ: Mapping[str, str], extra: frozenset[str] = frozenset()) -> dict[str, str]:
    """The allow-listed part of environ that a job may inherit (plus the names in `extra`)."""
    return {k: v for k, v in environ.items()
            if k in JOB_ENV_NAMES or k in extra or k.startswith(JOB_ENV_PREFIXES)}


@contextmanager
def only_job_environment(
    extra: frozenset[str] = frozenset(), values: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Within the block, os.environ is the job allow-list: sbatch (whose --export=ALL is the default)
    and submitit's local Popen both copy os.environ into the job, so this is what they hand on."""
    with _ENV_LOCK:
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(job_environment(saved, extra))
            os.environ.update(values or {})
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


# Local jobs are children of this process: keep their Popen handles so they get reaped.
_LOCAL_JOBS: dict[str, Job[Any]] = {}


def submit_phase(
    *, executor: str, folder: Path, python: str, tasks: int, settings: Settings, name: str,
    function: Any, args: tuple[Any, ...],
) -> PhaseJob:
    """Submit function(*args) as one job of `tasks` ranks; return its (folder, job id)."""
    private_dirs(settings.resolved_run_folder, folder)
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
    with only_job_environment(settings.job_env_names(), {"PYTHONPATH": pythonpath} if executor == "local" else {}):
        job = ex.submit(function, *args)
    if executor == "local":
        _LOCAL_JOBS[job.job_id] = job
    log.info("submitted %s as %s job %s in %s", name, executor, job.job_id, folder)
    return PhaseJob(executor=executor, folder=str(folder), job_id=str(job.job_id), tasks=tasks)


def private_dirs(root: Path, folder: Path) -> None:
    """Create root and every folder down to `folder` as 0700 (owner only).

    A run folder holds checkpoints, logs and the result pickles the scheduler unpickles: whoever can
    write there can run code in the scheduler, so nobody but the service's user may.
    """
    for path in [root, *reversed([p for p in folder.parents if p.is_relative_to(root) and p != root]), folder]:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)


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
