"""Submitit on one side, plain (folder, job id) on the other: submit, re-attach, poll, fetch, cancel.

Slurm jobs are submitted with --no-requeue (a preempted or failed node must not start a second copy
of an attempt behind our back; the scheduler retries as a new attempt in a new folder) and a job
name that names run, phase and attempt (`slurm_jobs`). Local jobs lead their own process group and
are known by pid + start time (`local_jobs`), so a restarted scheduler can still stop them.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.core import Job

from jobs.protocol import read_job_file_tail
from service.core.settings import Settings, get_settings, parse_size
from service.executors import isolation, job_cgroup, job_leases, job_limits
from service.executors import job_user as jobuser
from service.executors.job_home import VAR_TMP, make_private, private_environment
from service.executors.local_jobs import CONTROLLER_LOG, IsolatedLocalExecutor, kill_group, local_process, start_time

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
# One sacct call for every Slurm job at most this often: finished phases are noticed from their
# result files (a stat), so sacct only has to catch jobs that died without writing one.
SACCT_MIN_INTERVAL_S = 5.0
_last_sacct = float("-inf")

# Slurm states that mean the infrastructure, not the code under test, stopped the phase.
INFRA_STATES = frozenset(
    {"CANCELLED", "NODE_FAIL", "PREEMPTED", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "LOST"}
)
# scancel's answers for a job that has already ended (nothing left to cancel)
_GONE = re.compile(r"already completing or completed|Invalid job id", re.I)


@dataclass(frozen=True)
class JobRequest:
    """One job to submit, as a value (the executor's one argument, whichever executor runs it): function(*args) as
    `tasks` ranks over `nodes`, in `folder` (the attempt's or build's submitit folder), with `python`, named `name`.

    network: the job reaches the package index (a build: pip fetches from it). A local job has a network
    namespace of its own with only loopback (isolation.py): not the host's Postgres or API, and no other
    job's ports to clash with; with `network`, its one way out is the index gateway (index_gateway.py: the
    hosts of PARITY_BUILD_HOSTS only). A Slurm job keeps its node's network.
    gpus_per_node: GPUs the job asks for on each node (a `device: cuda` check: one per rank, RunPlan's
    Payload.gpus_per_node): Slurm's --gpus-per-node, the local executor's CUDA_VISIBLE_DEVICES.
    nice: Slurm's `--nice` (background work yields to user jobs); the local executor orders its work before
    submitting (service/scheduler/submitter.py).
    env_names: variables this job may inherit beyond the allow-list (a build needs pip's).
    nodes: Slurm nodes the ranks are spread over, tasks / nodes per node (the local executor runs every rank on
    this host whatever it says).
    gate: the run's folder, which the job may pass through while it lives (service/executors/job_user.py);
    also_writable: other folders the same job writes (the resume a "process" isolation job forks).
    """

    executor: str
    folder: Path
    python: str
    tasks: int
    name: str
    function: Any
    args: tuple[Any, ...]
    env_names: frozenset[str] = frozenset()
    nodes: int = 1
    gate: Path | None = None
    also_writable: tuple[Path, ...] = ()
    nice: int = 0
    network: bool = False
    gpus_per_node: int = 0


@dataclass(frozen=True)
class PhaseJob:
    """What the database keeps about one submitted phase."""

    executor: str
    folder: str
    job_id: str
    tasks: int
    # local jobs: the controller's start time, so a reused pid is never taken for the job
    started: float | None = None


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
    # job-side knobs read by jobs/ (checkpoint save manager, fast exit); a test's faults come from a test-only
    # plugin on PYTHONPATH (tests/plugins/job_faults.py), never from a variable
    "PARITY_SAVE_MANAGER_QUEUE", "PARITY_FAST_EXIT",
})
JOB_ENV_PREFIXES = ("LC_", "SLURM_", "SUBMITIT_", "OMP_", "MKL_", "NCCL_", "GLOO_", "TORCH_")


def job_environment(environ: Mapping[str, str], extra: frozenset[str] = frozenset()) -> dict[str, str]:
    """The allow-listed part of environ that a job may inherit (plus the names in `extra`)."""
    return {k: v for k, v in environ.items()
            if k in JOB_ENV_NAMES or k in extra or k.startswith(JOB_ENV_PREFIXES)}


# Local jobs are children of this process: keep their Popen handles so they get reaped.
_LOCAL_JOBS: dict[str, Job[Any]] = {}


class _SlurmExecutor(submitit.SlurmExecutor):
    run_as: jobuser.JobUser | None = None
    job_env: dict[str, str] | None = None  # all the job sees of the service's environment (job_environment)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # sbatch as root with --uid/--gid: the job runs as the job user (Slurm refuses these from anyone else)
        who = [f"--uid={self.run_as.uid}", f"--gid={self.run_as.gid}"] if self.run_as else []
        # sbatch hands its own environment to the job (--export=ALL), and submitit starts it with ours:
        # `env -i` gives it exactly the job's, as argv (no shell, no quoting), leaving os.environ alone
        given = ["env", "-i", *(f"{k}={v}" for k, v in self.job_env.items())] if self.job_env is not None else []
        return [*given, "sbatch", *who, str(submission_file_path)]


def submit_phase(request: JobRequest, settings: Settings) -> PhaseJob:
    """Submit the request as one job; return its handle (what each field means: JobRequest).

    With PARITY_JOB_USER the job runs as a user of its own (job_leases) and may write only its folder's
    parent (the attempt or build folder, handed over here, taken back by the caller when the phase
    ends, which then gives the user back: job_leases.release), and the request's gate and also_writable.
    Every job's processes may write at most PARITY_RUN_DISK_QUOTA per file (RLIMIT_FSIZE); the
    reconciler checks the folder's total.
    """
    if request.executor not in EXECUTORS:
        raise ValueError(f"executor: {request.executor!r} is not one of {', '.join(sorted(EXECUTORS))}")
    if request.nodes < 1 or request.tasks % request.nodes:
        raise ValueError(f"nodes: {request.nodes} does not divide tasks ({request.tasks})")
    folder = request.folder
    run_as = hand_over(settings, folder, gate=request.gate, also_writable=request.also_writable)
    try:
        return _submit(request, settings, run_as)
    except Exception:  # nothing runs: the folders and the user go back at once
        for granted in (folder.parent, *request.also_writable):
            jobuser.take_back(granted, run_as, root=settings.resolved_run_folder)
        job_leases.release(settings, folder.parent)
        raise


def _submit(request: JobRequest, settings: Settings, run_as: jobuser.JobUser | None) -> PhaseJob:
    folder = request.folder
    private = private_environment(folder.parent)
    # Put this checkout's jobs package on the path, so an environment needs only torch + Megatron-Core.
    current = os.environ.get("PYTHONPATH", "")
    pythonpath = current if str(REPO_ROOT) in current.split(os.pathsep) else os.pathsep.join(
        filter(None, [str(REPO_ROOT), current])
    )
    # passed to the job explicitly: the service's own os.environ is never changed (other threads read it)
    env = {**job_environment(os.environ, settings.job_env_names() | request.env_names), **private}
    ex = EXECUTORS[request.executor](request, settings, run_as, env, pythonpath)
    job = ex.submit(request.function, *request.args)
    started = None
    if request.executor == "local":
        _LOCAL_JOBS[job.job_id] = job
        started = start_time(int(job.job_id))
    log.info("submitted %s as %s job %s in %s", request.name, request.executor, job.job_id, folder)
    return PhaseJob(executor=request.executor, folder=str(folder), job_id=str(job.job_id), tasks=request.tasks,
                    started=started)


def _slurm_executor(request: JobRequest, settings: Settings, run_as: jobuser.JobUser | None, env: dict[str, str],
                    pythonpath: str) -> submitit.Executor:
    """submitit's Slurm executor for the request: sbatch with its tasks, time, partition, nice and GPUs."""
    # submitit pastes `python` into a shell command (the sbatch script): quote it, whatever its checks.
    # No exec in the job gains a privilege (a setuid file is an ordinary one to it), as a local job's sandbox.
    slurm = _SlurmExecutor(folder=request.folder, python=f"setpriv --no-new-privs {shlex.quote(request.python)}",
                           max_num_timeout=0)
    fsize = settings.run_disk_quota_bytes
    private = private_environment(request.folder.parent)
    params: dict[str, Any] = dict(
        ntasks_per_node=request.tasks // request.nodes, nodes=request.nodes, cpus_per_task=settings.slurm_cpus_per_task,
        time=settings.slurm_time_limit_min, job_name=request.name,
        # ulimit -f (1024-byte blocks) sets soft and hard RLIMIT_FSIZE; srun hands it to every task
        setup=[f"export PYTHONPATH={shlex.quote(pythonpath)}", f"ulimit -f {max(1, fsize // 1024)}",
               *[f"export {k}={shlex.quote(v)}"
                 for k, v in {**(run_as.environment() if run_as else {}), **private}.items()]],
        additional_parameters={**settings.sbatch_extra(), "no-requeue": True},
    )
    if settings.slurm_partition:
        params["partition"] = settings.slurm_partition
    if request.nice:
        params["additional_parameters"]["nice"] = request.nice
    if request.gpus_per_node:  # a cuda check: one GPU per rank (#SBATCH --gpus-per-node)
        params["gpus_per_node"] = request.gpus_per_node
    slurm.update_parameters(**params)
    slurm.run_as, slurm.job_env = run_as, env
    return slurm


def _local_executor(request: JobRequest, settings: Settings, run_as: jobuser.JobUser | None, env: dict[str, str],
                    pythonpath: str) -> submitit.Executor:
    """The local executor for the request: its ranks on this host, in the sandbox and cgroup promised to it."""
    local = IsolatedLocalExecutor(folder=request.folder, python=shlex.quote(request.python), max_num_timeout=0)
    local.update_parameters(tasks_per_node=request.tasks, timeout_min=settings.phase_timeout_min,
                            gpus_per_node=request.gpus_per_node)
    local.run_as, local.max_file_bytes = run_as, settings.run_disk_quota_bytes
    # gloo binds to the address the host's name resolves to, which a job's own network may not have
    local.job_env = {**env, "PYTHONPATH": pythonpath, "GLOO_SOCKET_IFNAME": "lo"}
    promised = isolation.required(settings)  # IsolationMissing names what this host cannot give
    local.cgroups = job_cgroup.jobs_root(settings.job_cgroup) if "cgroup" in promised else None
    local.limits = (settings.job_pids_max, settings.job_memory_max_bytes()) if "limits" in promised else None
    local.sandbox = _sandbox(settings, request.folder, request.python, promised,
                             writable=(request.folder.parent, *request.also_writable), network=request.network,
                             pythonpath=pythonpath)
    if "gateway" in local.sandbox:  # pip, uv and git go out through it (and only through it)
        local.job_env.update(gateway_environment())
    return local


# the executors a job may be submitted to, by the name a phase records (chosen once, here)
ExecutorFactory = Callable[[JobRequest, Settings, "jobuser.JobUser | None", dict[str, str], str], submitit.Executor]
EXECUTORS: dict[str, ExecutorFactory] = {"slurm": _slurm_executor, "local": _local_executor}


GATEWAY_PORT = 3128  # in the build's own network namespace: no other job's port to clash with


def gateway_environment() -> dict[str, str]:
    """What sends a build's pip, uv and git through its index gateway (no host bypasses it)."""
    url = f"http://127.0.0.1:{GATEWAY_PORT}"
    return {**{name: url for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                      "all_proxy")}, "NO_PROXY": "", "no_proxy": ""}


def linked_targets(root: Path) -> list[Path]:
    """The targets of the symlinks in root and in its builds folder (folders the service's tree shares,
    such as a Python base prepared once per machine); run folders are never walked (there are thousands)."""
    found = []
    for folder in (root, root / "environments"):
        try:
            found += [child.resolve() for child in folder.iterdir() if child.is_symlink()]
        except OSError:
            continue
    return found


def _sandbox(settings: Settings, folder: Path, python: str, promised: frozenset[str], *,
             writable: tuple[Path, ...], network: bool, pythonpath: str = "") -> dict[str, Any]:
    """job_sandbox.py's SPEC for a local job (its cgroups and user are added at the start)."""
    spec: dict[str, Any] = {"network": "network" in promised, "mounts": "mounts" in promised}
    if spec["network"] and network:  # a build: its own network too, with the package index its only way out
        # the node's own proxy, where it has one, carries every tunnel (never the job: it has no network)
        proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
        spec["gateway"] = {"port": GATEWAY_PORT, "allow": settings.build_hosts_allowed(), "proxy": proxy}
    if spec["mounts"]:
        own = Path(private_environment(folder.parent)["TMPDIR"])
        # what the job must reach, wherever it lives: under the node's /tmp it is bound back into the job's own
        needed = [folder, *writable, settings.resolved_run_folder, settings.resolved_artifact_folder, Path(python),
                  Path(sys.executable), REPO_ROOT, *(Path(p) for p in pythonpath.split(os.pathsep) if p)]
        # a folder the service's tree links to (a shared Python base under the node's /var/tmp, say) is as
        # needed as the tree: behind the job's own /tmp and /var/tmp its link would dangle
        needed += linked_targets(settings.resolved_run_folder)
        spec.update(folders={"/tmp": str(own), "/var/tmp": str(own.parent / VAR_TMP)},
                    shm_size=parse_size(settings.job_shm_size, "PARITY_JOB_SHM_SIZE"),
                    keep=sorted({str(p) for n in needed for p in (n.absolute(), n.resolve())}),
                    writable=[str(w) for w in writable])
    return spec


def hand_over(
    settings: Settings, folder: Path, *, gate: Path | None = None, also_writable: tuple[Path, ...] = (),
    worker: Path | None = None,
) -> jobuser.JobUser | None:
    """With PARITY_JOB_USER: give the job's user folder (a submitit folder) and its attempt folder, the
    run's gate and the other folders the job writes; the caller takes them back when the phase ends.
    The granted folder gets fresh private folders (make_private) for the job's HOME, TMPDIR and caches.
    Cold jobs get this at submission, with a user leased to them alone (job_leases.lease; NoFreeJobUser
    when the pool is all leased); a warm attempt before its order is placed, as the user of the `worker`
    (folder) that runs it. Returns the user."""
    run_as = job_leases.lease(settings, folder.parent) if worker is None else job_leases.user_of(settings, worker)
    root = settings.resolved_run_folder
    jobuser.prepare_tree(root, folder.parent, run_as)
    if gate is not None:
        jobuser.open_gate(gate, run_as)
    make_private(folder.parent)  # before the hand-over: the folder is still the service's
    jobuser.grant(folder.parent, run_as, root=root)
    jobuser.grant(folder, run_as, root=root)
    for other in also_writable:
        jobuser.prepare_tree(root, other, run_as)
        jobuser.grant(other, run_as, root=root)
    return run_as


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


def _status(spec: PhaseJob, handle: Job[Any]) -> JobStatus:
    if spec.executor == "local" and spec.job_id not in _LOCAL_JOBS:
        # re-attached after a restart: no Popen handle, so judge by the process and the result file
        if handle.paths.result_pickle.exists():
            raw = "FINISHED"
        elif local_process(spec.job_id, spec.started) is not None:
            raw = "RUNNING"
        else:
            raw = "LOST"
    else:
        state = submitit.SlurmJob.watcher.get_state(spec.job_id, mode="cache") if spec.executor == "slurm" \
            else handle.state
        raw = str(state).split()[0].upper() if state else "UNKNOWN"
    return JobStatus(kind=_kind(raw), raw=raw)


def poll(jobs: list[PhaseJob]) -> dict[PhaseJob, JobStatus]:
    """States of many jobs; all Slurm jobs share one sacct call, made at most every SACCT_MIN_INTERVAL_S."""
    global _last_sacct
    handles = {j: _submitit_job(j) for j in jobs}
    if any(j.executor == "slurm" for j in jobs) and time.monotonic() - _last_sacct >= SACCT_MIN_INTERVAL_S:
        # submitit would call sacct on every state read after a handle registers; call it once, here
        submitit.SlurmJob.watcher.update()
        _last_sacct = time.monotonic()
    out: dict[PhaseJob, JobStatus] = {}
    for spec, handle in handles.items():
        try:
            out[spec] = _status(spec, handle)
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


def failure_text(job: PhaseJob, max_bytes: int = 8000) -> str:
    """Why a job's ranks ended without documents: the tail of each task's stderr, read as text.

    The job's result pickles are never loaded: whatever a job writes is data, and a pickle is code
    (service/scheduler/reconciler.py reads the ranks' JSON documents instead).
    """
    handle = _submitit_job(job)
    tails = []
    for task in range(job.tasks):
        tail = read_job_file_tail(handle.task(task).paths.stderr, max_bytes // max(1, job.tasks)).strip()
        if tail:
            tails.append(f"rank {task}: {tail}")
    if not tails:  # no rank wrote anything: the local controller (or its sandbox step) may have said why
        controller = read_job_file_tail(Path(handle.paths.folder) / CONTROLLER_LOG, max_bytes).strip()
        if controller:
            tails.append(f"controller: {controller}")
    return "\n".join(tails) or f"job {job.job_id} ended without a result and without output on stderr"


def cancel(job: PhaseJob) -> None:
    """Ask the executor to stop a job: scancel, or SIGTERM then SIGKILL to a local job's process group.

    Raises when the request could not be made (scancel failed); only a later `poll` that sees the
    job ended confirms it is gone.
    """
    if job.executor == "slurm":
        out = subprocess.run(["scancel", job.job_id], capture_output=True, text=True, timeout=60)
        if out.returncode != 0 and not _GONE.search(out.stderr):
            raise RuntimeError(f"scancel {job.job_id}: {out.stderr.strip() or out.returncode}")
        return
    proc = local_process(job.job_id, job.started)
    if proc is not None:
        kill_group(proc)
        local = _LOCAL_JOBS.get(job.job_id)
        if local is not None:
            local._process.wait(timeout=10)  # type: ignore[attr-defined]  # reap our own child
    end_job(job, get_settings())


def end_job(job: PhaseJob, settings: Settings) -> int:
    """A job has ended (or was stopped): kill what it left running, its daemons included, and reap.

    A local job: everything it started is in its cgroup (job_cgroup.py), however it detached; the cgroup
    is killed whole and removed. Any job with a user of its own (job_leases): every process of that uid
    on this host is killed, which is what ends a `setsid` daemon a Slurm job left (proctrack/linuxproc
    tracks none that detached; SLURM.md). Both before the caller takes the job's folder back. Returns
    how many processes were left.
    """
    left = job_leases.stop(settings, Path(job.folder).parent)
    if job.executor != "local":
        if left:
            log.info("%s job %s left %d processes running; killed", job.executor, job.job_id, left)
        return left
    try:
        root = job_cgroup.jobs_root(settings.job_cgroup)
    except job_cgroup.CgroupError as exc:
        log.warning("not ending local job %s: %s", job.job_id, exc)
        return left
    if root is not None:
        cgroup = job_cgroup.cgroup_of(root, Path(job.folder))
        left += job_cgroup.kill(cgroup)
        job_limits.remove(cgroup.name)  # its caps' v1 cgroups, empty now
    if left:
        log.info("local job %s left %d processes running; killed", job.job_id, left)
    local = _LOCAL_JOBS.get(job.job_id)
    if local is not None:
        local._process.poll()  # type: ignore[attr-defined]  # reap the controller once it is gone
    job_cgroup.reap_orphans(keep=frozenset(int(j) for j in _LOCAL_JOBS if j.isdigit()))
    return left


def log_paths(job: PhaseJob) -> list[str]:
    """stdout/stderr files of every rank of a job."""
    handle = _submitit_job(job)
    paths = []
    for task in range(job.tasks):
        sub = handle.task(task)
        paths += [str(sub.paths.stdout), str(sub.paths.stderr)]
    return paths


def task_log_files(job: PhaseJob) -> list[tuple[str, str]]:
    """(stdout, stderr) of every rank of a job, where submitit puts them (a warm order writes there too)."""
    handle = _submitit_job(job)
    return [(str(handle.task(t).paths.stdout), str(handle.task(t).paths.stderr)) for t in range(job.tasks)]
