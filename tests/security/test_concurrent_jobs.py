"""Two jobs live at once cannot reach each other, and nothing of a Slurm job outlives it.

Each job (phase attempt, build, warm worker) runs as a user of its own, leased from the pool
PARITY_JOB_USER names (`parity-job-0`, `parity-job-1`, …: scripts/job-user.sh; service/executors/
job_leases.py). The attacks, as a hostile build would make them:

- a job that learns another live job's pid (any job may list /proc) signals it, ptraces it, reads its
  environment and its granted folder, and plants a file there;
- a Slurm job starts a `setsid` daemon: single-node Slurm tracks processes with proctrack/linuxproc,
  which loses a process that left the job's session, so the daemon outlives its job and keeps the
  job user's rights over the next jobs.

Each runs twice: as one user shared by every job (the weaker mode, a deployment with no pool: the
attack works, which is what the defence must change) and with a user per job (refused, killed).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import Settings
from service.executors import job_leases, launcher
from service.executors.job_user import JobUser
from tests.plugins.job_user import JOB_USER, reachable_folder, require_job_user

# the shared mode: PARITY_JOB_USERS=0, every job runs as parity-job itself, as every job did before the pool
MODES: dict[str, int | None] = {"user-per-job": None, "one-shared-user": 0}
PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def _require_pool() -> None:
    require_job_user()
    try:
        JobUser.lookup(f"{JOB_USER}-1")
    except Exception:  # noqa: BLE001 - missing user, not root: the same remedy
        why = f"no pool users {JOB_USER}-0, -1, …: run scripts/job-user.sh"
        if os.environ.get("PARITY_REQUIRE_JOB_USER") == "1":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture
def base() -> Iterator[Path]:
    with reachable_folder("parity-concurrent") as folder:
        yield folder


def victim(folder: str) -> str:
    """A job that keeps a secret in its folder and waits (up to 5 min) for the test to say stop."""
    Path(folder, "secret.txt").write_text("the victim's secret")
    Path(folder, "victim.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + 300
    while not Path(folder, "stop").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return "survived"


def attacker(pid: int, folder: str) -> dict[str, str]:
    """A job that got another live job's pid and folder: each attack's outcome, "done" or why it failed."""
    libc = ctypes.CDLL(None, use_errno=True)
    outcome: dict[str, str] = {}

    def ptrace() -> None:
        if libc.ptrace(PTRACE_ATTACH, pid, None, None) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        os.waitpid(pid, 0)
        libc.ptrace(PTRACE_DETACH, pid, None, None)

    attacks: dict[str, Any] = {
        "read its environment": lambda: Path(f"/proc/{pid}/environ").read_bytes(),
        "read its folder": lambda: Path(folder, "secret.txt").read_text(),
        "write its folder": lambda: Path(folder, "planted.txt").write_text("planted"),
        "ptrace it": ptrace,
        "signal it": lambda: os.kill(pid, signal.SIGSTOP),  # stopped, not killed: the test still sees the rest
    }
    for name, attack in attacks.items():
        try:
            attack()
            outcome[name] = "done"
        except OSError as exc:
            outcome[name] = f"refused: {exc.strerror}"
    return outcome


def _wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _finish(settings: Settings, job: launcher.PhaseJob) -> None:
    """What the scheduler does when a job's phase ends: kill what it left, then give its user back."""
    launcher.end_job(job, settings)
    job_leases.release(settings, Path(job.folder).parent)


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_jobs_cannot_signal_ptrace_or_read_each_other(base: Path, mode: str) -> None:
    import cloudpickle

    _require_pool()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, job_users=MODES[mode])
    folders = [base / "runs" / f"run-{n}" / "train_and_save" / "attempt-1" / "submitit" for n in (1, 2)]
    jobs: list[launcher.PhaseJob] = []
    try:
        jobs.append(launcher.submit_phase(launcher.JobRequest(
            executor="local", folder=folders[0], python=sys.executable, tasks=1, name="victim", function=victim,
            args=(str(folders[0].parent),),
        ), settings))
        pid = int(_wait(lambda: _read(folders[0].parent / "victim.pid"), 120, "the victim job to start"))
        jobs.append(launcher.submit_phase(launcher.JobRequest(
            executor="local", folder=folders[1], python=sys.executable, tasks=1, name="attacker", function=attacker,
            args=(pid, str(folders[0].parent)),
        ), settings))
        outcome = launcher._LOCAL_JOBS[jobs[1].job_id].result()
        os.kill(pid, signal.SIGCONT)  # if the attack stopped it
        (folders[0].parent / "stop").write_text("")
        survived = launcher._LOCAL_JOBS[jobs[0].job_id].result()
        users = {job_leases.user_of(settings, f.parent) for f in folders}
        if mode == "user-per-job":
            assert len(users) == 2 and not users & {None}, users  # a user each, from the pool
            assert all(v.startswith("refused") for v in outcome.values()), outcome
            assert survived == "survived" and not (folders[0].parent / "planted.txt").exists()
        else:  # the weaker mode: the attacks work (what the pool is for)
            assert len(users) == 1, users
            assert outcome["signal it"] == outcome["read its folder"] == outcome["write its folder"] == "done", outcome
            assert outcome["read its environment"] == "done", outcome
    finally:
        for job in jobs:
            _finish(settings, job)
    assert not _leases_under(settings, base), "a job's user was not given back"


def _leases_under(settings: Settings, base: Path) -> list[str]:
    """The pool users leased to folders under `base` (the lease folder is the host's, shared)."""
    return [user for user, folder in job_leases.holders(settings).items() if folder.startswith(f"{base}/")]


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _proctrack() -> str:
    """The cluster's ProctrackType (scripts/slurm-up.sh: proctrack/cgroup where the host has cgroup v1)."""
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60, check=True)
    return next((line.split("=", 1)[1].strip() for line in out.stdout.splitlines()
                 if line.startswith("ProctrackType")), "")


def _daemon_job(settings: Settings, base: Path, executor: str) -> tuple[launcher.PhaseJob, Path]:
    import cloudpickle

    from tests.plugins.daemons import leave_a_daemon

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(sys.modules[leave_a_daemon.__module__])
    folder = base / "runs" / "run-1" / "train_and_save" / "attempt-1" / "submitit"
    job = launcher.submit_phase(launcher.JobRequest(
        executor=executor, folder=folder, python=sys.executable, tasks=1, name=f"parity-daemon-{base.name}",
        function=leave_a_daemon, args=(str(folder.parent / "daemon.pid"),),
    ), settings)
    return job, folder


@pytest.mark.slurm
@pytest.mark.parametrize("mode", MODES)
def test_a_daemon_a_slurm_job_leaves_is_killed_when_the_job_ends(base: Path, slurm: str, mode: str) -> None:
    """Under proctrack/cgroup the cluster kills the daemon with its job; under proctrack/linuxproc it
    escapes the job, and the job's own user is what the scheduler kills it by when the phase ends."""
    _require_pool()
    tracked = _proctrack() == "proctrack/cgroup"
    settings = Settings(executor="slurm", run_folder=base / "runs", job_user=JOB_USER, job_users=MODES[mode])
    job, folder = _daemon_job(settings, base, "slurm")
    pid = 0
    try:
        pid = launcher._submitit_job(job).result()
        _wait(lambda: launcher.poll([job])[job].kind == "done", 120, "Slurm to see the job end")
        if tracked:
            _wait(lambda: not _alive(pid), 60, "proctrack/cgroup to end the daemon with its job")
        else:
            assert _alive(pid), "the daemon should have left the Slurm job (proctrack/linuxproc): the attack"
        left = launcher.end_job(job, settings)  # what the scheduler does when the phase ends
        if mode == "user-per-job":
            assert not _alive(pid), "a setsid daemon outlived its Slurm job"
            assert tracked or left >= 1, "the job's user had nothing left running"
        elif not tracked:  # one shared user: killing by uid would kill every other job, so nothing is
            assert left == 0 and _alive(pid)
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        job_leases.release(settings, folder.parent)


@pytest.mark.slurm
def test_a_slurm_job_a_job_queued_is_refused_or_cancelled_with_its_lease(base: Path, slurm: str) -> None:
    """The review's job ran `sbatch --begin=now+75`: its Slurm job ran as the pool user after the lease was
    given back. Job users may not submit where scripts/slurm-up.sh's job_submit rule holds; what one queued
    anyway (a cluster without the rule) is cancelled with its lease, before the uid serves anyone else."""
    import cloudpickle

    import tests.plugins.daemons as daemons

    _require_pool()
    cloudpickle.register_pickle_by_value(daemons)
    settings = Settings(executor="slurm", run_folder=base / "runs", job_user=JOB_USER)
    folder = base / "runs" / "run-1" / "train" / "attempt-1" / "submitit"
    job = launcher.submit_phase(launcher.JobRequest(
        executor="slurm", folder=folder, python=sys.executable, tasks=1, name="sbatch-later",
        function=daemons.queue_a_later_slurm_job, args=(),
    ), settings)
    user = job_leases.user_of(settings, folder.parent)
    assert user is not None
    try:
        out = launcher._submitit_job(job).result()
        _wait(lambda: launcher.poll([job])[job].kind == "done", 120, "Slurm to see the job end")
        launcher.end_job(job, settings)
    finally:
        job_leases.release(settings, folder.parent)
    queued = subprocess.run(["squeue", "-h", "-u", user.name, "-o", "%i %T"], capture_output=True, text=True)
    assert queued.stdout.strip() == "", f"{user.name} still has Slurm jobs after its lease: {queued.stdout} ({out})"
    if out["rc"] == 0:  # a cluster without the rule: the job was queued, and is gone now
        state = subprocess.run(["sacct", "-n", "-X", "-j", str(out["out"]), "-o", "State"], capture_output=True,
                               text=True).stdout
        assert "CANCELLED" in state or not state.strip(), state
    else:
        assert "job users may not submit" in str(out["err"]), out


@pytest.mark.parametrize("mode", MODES)
def test_a_daemon_a_local_job_leaves_dies_with_its_user_without_a_cgroup(base: Path, mode: str) -> None:
    """The kill by uid alone (PARITY_JOB_CGROUP=off: no cgroup holds the job, as on a host without a
    writable cgroup v2): with a user per job the daemon dies when the phase ends, with one shared user
    nothing may kill it without killing every other job."""
    _require_pool()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, job_users=MODES[mode],
                        job_cgroup="off", job_isolation_waive="cgroup,limits")
    job, folder = _daemon_job(settings, base, "local")
    pid = 0
    try:
        pid = launcher._LOCAL_JOBS[job.job_id].result()
        assert _alive(pid), "the daemon should still run once its job returned (that is the attack)"
        left = launcher.end_job(job, settings)
        if mode == "user-per-job":
            assert left >= 1 and not _alive(pid), "a setsid daemon outlived its job"
        else:
            assert left == 0 and _alive(pid)
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        job_leases.release(settings, folder.parent)


def test_a_user_serves_one_live_job_and_comes_back_with_nothing_running(base: Path) -> None:
    """Leases are exclusive (a full pool makes the next job wait), and a user given back, or found still
    running something when leased again (a scheduler that died), has every process killed first. The
    lease folder is the host's: what other schedulers hold here is left alone."""
    _require_pool()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER)
    held: list[JobUser] = []
    with pytest.raises(job_leases.NoFreeJobUser, match="PARITY_JOB_USERS"):
        for n in range(len(job_leases.pool_of(JobUser.lookup(JOB_USER))) + 1):
            user = job_leases.lease(settings, base / f"job-{n}")
            assert user is not None
            held.append(user)
    try:
        assert held and len({u.uid for u in held}) == len(held)  # one user per job
        assert job_leases.lease(settings, base / "job-0") == held[0]  # the same job asking again: its own
        first = held[0]
        # what a job of that user leaves running: a daemon in a session of its own
        daemon = subprocess.Popen(["setpriv", f"--reuid={first.uid}", f"--regid={first.gid}", "--clear-groups",
                                   "--", "sleep", "300"], start_new_session=True)
        try:
            _wait(lambda: _uid_of(daemon.pid) == first.uid, 10, "the daemon to drop to the job user")
            job_leases.release(settings, base / "job-0")
            assert daemon.wait(timeout=10) == -signal.SIGKILL  # killed before the user went back to the pool
            assert job_leases.lease(settings, base / "one-too-many") == first
        finally:
            daemon.kill()
            daemon.wait()
        # a lease whose folder is gone (its run deleted, its scheduler dead) is taken over
        job_leases.release(settings, base / "one-too-many")
        gone = base / "deleted-run"
        gone.mkdir()
        assert job_leases.lease(settings, gone) == first
        gone.rmdir()
        with pytest.raises(job_leases.NoFreeJobUser):  # a hand-over in progress (its folder not made yet)
            job_leases.lease(settings, base / "after-the-deletion")
        old = time.time() - job_leases.ORPHAN_AFTER_S - 1  # an hour later: its scheduler is gone for good
        os.utime(settings.job_lease_folder / first.name, (old, old))
        assert job_leases.lease(settings, base / "after-the-deletion") == first
    finally:
        for folder in [*(base / f"job-{n}" for n in range(len(held))), base / "one-too-many",
                       base / "after-the-deletion"]:
            job_leases.release(settings, folder)
    assert not _leases_under(settings, base)


def test_a_lease_picks_a_random_free_user(base: Path) -> None:
    """The review's attacker knew which uid the victim's next job would get (the lowest free one) and left a
    setuid shell for it: a lease picks at random among the free users, so a job cannot aim at the next one."""
    _require_pool()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER)
    seen = []
    try:
        for n in range(20):  # 20 leases of one user at a time: with two or more free, one name 20 times is ~2^-19
            user = job_leases.lease(settings, base / f"job-{n}")
            assert user is not None
            seen.append(user.name)
            job_leases.release(settings, base / f"job-{n}")
    finally:
        for n in range(20):
            job_leases.release(settings, base / f"job-{n}")
    assert len(set(seen)) > 1, seen


def _uid_of(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).uids().real)
    except psutil.NoSuchProcess:
        return None
