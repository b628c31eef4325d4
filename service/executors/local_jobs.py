"""Local jobs that can be found and stopped again: own process group, known by pid + start time.

submitit's LocalExecutor starts its controller in the scheduler's own process group and keeps the
only handle in memory, so after a restart nothing can stop the job, and a pid reused by another
process looks like the job. Here the controller leads a session of its own (it and its ranks form
one process group that can be killed as a whole) and the controller's start time is recorded.

Nothing of the scheduler's is handed down: the controller's stdin is /dev/null and its stdout and stderr go
to `controller.log` in the job's own folder, a file made for it. A rank of the same uid can take any
descriptor its controller holds (pidfd_getfd); had the controller inherited the scheduler's stdout and
stderr (the service's log, under systemd the journal) a job could write forged lines into it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import submitit
from submitit.local import local as submitit_local

from service.executors import job_cgroup, job_limits
from service.executors.isolation import IsolationMissing, sandbox_command
from service.executors.job_user import JobUser

CONTROLLER_LOG = "controller.log"  # the controller's stdout and stderr (a sandbox step that failed says so here)


def open_controller_log(folder: Path) -> int:
    """A new file `controller.log` in the job's folder, open for appending: never through a link, never a file
    or FIFO the job left there (the entry is removed and made again, O_EXCL | O_NOFOLLOW, by directory fd)."""
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(5):
            try:
                return os.open(CONTROLLER_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                               | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            except FileExistsError:
                os.unlink(CONTROLLER_LOG, dir_fd=dir_fd)  # the entry itself, a link's target untouched
        raise FileExistsError(f"{folder / CONTROLLER_LOG}: something keeps putting a file there")
    finally:
        os.close(dir_fd)


class IsolatedLocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, with the controller started as the leader of its own session, with
    RLIMIT_FSIZE (no file bigger than the run's quota) and, as root, inside its sandbox (job_sandbox.py):
    its cgroup (`cgroups`: where to make it, service/executors/job_cgroup.py) with its caps (`limits`),
    its own mounts and network as `sandbox` says, no_new_privs, and the job user (`run_as`)."""

    run_as: JobUser | None = None
    max_file_bytes: int | None = None
    cgroups: Path | None = None
    limits: tuple[str, int | None] | None = None  # (pids.max, memory.max bytes or None) on the job's cgroup
    sandbox: dict[str, Any] | None = None  # job_sandbox.py's SPEC, without the cgroups and the user
    job_env: dict[str, str] | None = None  # all the job sees of the service's environment (launcher)

    def _submit_command(self, command: str) -> submitit_local.LocalJob[Any]:
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = dict(self.job_env if self.job_env is not None else os.environ)
        env.update(
            SUBMITIT_LOCAL_NTASKS=str(ntasks), SUBMITIT_LOCAL_COMMAND=command,
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 2.0))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S="30", SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="", SUBMITIT_EXECUTOR="local",
            # the GPUs the job asked for (a cuda check: one per rank), none otherwise
            CUDA_VISIBLE_DEVICES=",".join(str(k) for k in range(int(self.parameters.get("gpus_per_node") or 0))),
            SUBMITIT_LOCAL_WITH_SHELL="",
        )
        command_line = [sys.executable, "-m", "submitit.local._local", str(self.folder)]
        if self.max_file_bytes is not None:
            # prlimit sets soft and hard limits before exec: the job cannot raise them again
            command_line = ["prlimit", f"--fsize={self.max_file_bytes}:{self.max_file_bytes}", "--", *command_line]
        who: dict[str, Any] = {}
        if self.run_as is not None:
            env.update(self.run_as.environment())
        if self.sandbox is not None:
            spec: dict[str, Any] = dict(self.sandbox)
            procs: list[str] = []
            if self.cgroups is not None:
                # into the job's cgroup first (as root), before anything of the job runs
                cgroup = job_cgroup.cgroup_of(self.cgroups, Path(self.folder))
                job_cgroup.kill(cgroup)  # whatever an earlier job from this folder left
                cgroup.mkdir(exist_ok=True)
                procs.append(str(cgroup / "cgroup.procs"))
                if self.limits is not None:
                    try:
                        procs += [str(p) for p in job_limits.apply(cgroup, pids_max=self.limits[0],
                                                                   memory_max=self.limits[1])]
                    except job_limits.LimitsError as exc:
                        job_cgroup.kill(cgroup)
                        raise IsolationMissing(f"local jobs cannot start: limits: {exc} "
                                               "(PARITY_JOB_ISOLATION_WAIVE=limits runs them without)") from None
                job_cgroup.become_subreaper()
            spec["cgroups"] = procs
            if self.run_as is not None:
                spec.update(uid=self.run_as.uid, gid=self.run_as.gid)
            command_line = sandbox_command(spec, command_line)
            who = dict(umask=0o022) if self.run_as is not None else {}
        elif self.run_as is not None:
            # setuid/setgid in the child before exec, no supplementary groups (root's would leak in)
            who = dict(user=self.run_as.uid, group=self.run_as.gid, extra_groups=[], umask=0o022)
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        log_fd = open_controller_log(Path(self.folder))
        try:
            # only its own log and /dev/null: no descriptor of the scheduler's reaches the job (close_fds)
            process = subprocess.Popen(command_line, env=env, start_new_session=True, cwd="/", stdin=subprocess.DEVNULL,
                                       stdout=log_fd, stderr=log_fd, close_fds=True, **who)
        finally:
            os.close(log_fd)
        return submitit_local.LocalJob(folder=self.folder, job_id=str(process.pid), process=process,
                                       tasks=list(range(ntasks)))


def start_time(pid: int) -> float:
    """The start time of a process, as recorded for a local job."""
    return float(psutil.Process(pid).create_time())


def local_process(job_id: str, started: float | None) -> psutil.Process | None:
    """The live controller process of a local job: same pid and same start time, else None.

    Without a recorded start time the pid alone proves nothing (it may have been reused), and a
    process we cannot prove is ours is never signalled.
    """
    if started is None:
        return None
    try:
        proc = psutil.Process(int(job_id))
        if proc.status() == psutil.STATUS_ZOMBIE or abs(proc.create_time() - started) > 0.01:
            return None  # gone, or the pid now belongs to another process
        return proc
    except (psutil.NoSuchProcess, ValueError):
        return None


def kill_group(proc: psutil.Process, grace_s: float = 5.0) -> None:
    """SIGTERM the process group `proc` leads, then SIGKILL what is left after grace_s."""
    pgid = os.getpgid(proc.pid)
    if pgid != proc.pid:  # not a controller started in its own session: never signal a stranger's group
        raise RuntimeError(f"local job {proc.pid} does not lead its process group ({pgid})")
    os.killpg(pgid, signal.SIGTERM)  # submitit's ranks ignore SIGTERM (preemption notice), hence the SIGKILL
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except ProcessLookupError:
            continue
    return False
