"""Nothing of a local job outlives it: each job runs in a cgroup of its own, killed whole when it ends.

A process group is not enough: a job's `setsid` daemon leaves the group (and the session), keeps
running as the job user and can write into later jobs' live folders. A cgroup (v2) holds every
process a job starts, whatever it does with sessions, and `cgroup.kill` ends them all at once. The
controller is started as root by job_sandbox.py, which moves itself into the job's cgroup before it
builds the job's namespaces and drops to the job user, so nothing of the job runs before it is inside. The scheduler
becomes a child subreaper, so the killed daemons' zombies are its to reap (`reap_orphans`).

PARITY_JOB_CGROUP: unset or "auto" uses a cgroup v2 hierarchy when the scheduler may write it (root on
a host or container with a writable /sys/fs/cgroup; systemd: `Delegate=yes`), "off" never does, and a
path names the folder jobs' cgroups are made in. Without one a job is stopped by its process group
only, and a daemon that left it survives (docs/security.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import time
from functools import lru_cache
from pathlib import Path

import psutil

log = logging.getLogger(__name__)
PR_SET_CHILD_SUBREAPER = 36
JOBS_FOLDER = "parity-jobs"


class CgroupError(RuntimeError):
    """PARITY_JOB_CGROUP names a folder that is not a writable cgroup v2 hierarchy."""


def mounts() -> list[list[str]]:
    """This process's mount table, one split line each ([] when it cannot be read)."""
    try:
        return [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return []


def _cgroup2_mount() -> Path | None:
    for parts in mounts():
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def _own_cgroup() -> str:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
    except OSError:
        pass
    return "/"


@lru_cache(maxsize=8)
def jobs_root(setting: str | None) -> Path | None:
    """Where job cgroups are made (None: no cgroups here); CgroupError when a named one is unusable."""
    if setting == "off":
        return None
    if setting and setting != "auto":
        root = Path(setting)
        if not (root / "cgroup.procs").is_file() or not os.access(root, os.W_OK):
            raise CgroupError(f"PARITY_JOB_CGROUP: {setting!r} is not a cgroup v2 folder the scheduler may write "
                              "(allowed: auto, off, or such a folder)")
        return root
    mount = _cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        return None
    root = mount / _own_cgroup().lstrip("/") / JOBS_FOLDER
    try:
        root.mkdir(exist_ok=True)
        _probe(root)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("no cgroup for local jobs (%s): a daemon a job leaves may outlive it", exc)
        return None
    return root


def _probe(root: Path) -> None:
    """Move a throwaway process into a throwaway cgroup under root, as a job's start would (OSError if refused)."""
    probe = root / f"probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        done = subprocess.run(["/bin/sh", "-c", 'echo $$ > "$1"', "sh", str(probe / "cgroup.procs")],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise OSError(f"cannot move a process into {probe}: {done.stderr.strip()}")
    finally:
        kill(probe)


def cgroup_of(root: Path, folder: Path) -> Path:
    """The cgroup of the local job submitted from `folder` (found again from the folder after a restart)."""
    return root / hashlib.sha1(str(folder).encode()).hexdigest()[:20]


def become_subreaper() -> None:
    """Orphans of local jobs (a killed daemon) become this process's children, so it can reap them."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _pids(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def kill(cgroup: Path, timeout_s: float = 10.0) -> int:
    """Kill every process in the job's cgroup and remove it; how many were still there."""
    if not cgroup.is_dir():
        return 0
    left = _pids(cgroup)
    if left:
        if (cgroup / "cgroup.kill").exists():
            (cgroup / "cgroup.kill").write_text("1")
        else:  # before 5.14: freeze so none forks while we kill, then thaw to let SIGKILL land
            frozen = (cgroup / "cgroup.freeze").exists()
            if frozen:
                (cgroup / "cgroup.freeze").write_text("1")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if frozen:
                (cgroup / "cgroup.freeze").write_text("0")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cgroup.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:  # EBUSY while the killed processes are still exiting
            if time.monotonic() > deadline:
                log.warning("cgroup %s still holds %s after SIGKILL", cgroup, _pids(cgroup))
                break
            time.sleep(0.05)
    return len(left)


def reap_orphans(keep: frozenset[int] = frozenset()) -> int:
    """Reap zombie children that are not ours to wait for: orphans of jobs reparented to this subreaper.

    Only children in another session than this process (a job's daemons are; subprocess.run's own
    children are not, and their waiter must see their status), and never the pids in `keep`.
    """
    own_sid, reaped = os.getsid(0), 0
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return 0
    for child in children:
        try:
            if child.pid in keep or child.status() != psutil.STATUS_ZOMBIE or os.getsid(child.pid) == own_sid:
                continue
            if os.waitpid(child.pid, os.WNOHANG)[0]:
                reaped += 1
        except (psutil.Error, ProcessLookupError, ChildProcessError):
            continue
    return reaped
