"""Where any job user may leave a file on this node: the folders every uid may write.

The lease's sweep (job_leases.remove_files_of) removes what a job's uid made in them before the uid serves
another job. The usual ones are always swept; a node may have more (a world-writable drop folder an admin
made, a distribution's crash folder), so the node's local file systems are walked for folders that others
may write and reach, and those are swept too. The walk (~2 s on this project's test machine) is kept for
REDISCOVER_AFTER_S: only root or a folder's owner makes a new one, and a job's uid cannot (what it makes
lies inside a folder already found, swept whole).

Network file systems (NFS, Lustre, ...) are not walked: they can hold millions of folders, and a shared
scratch space is the cluster's to purge (docs/security.md).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

# Where any uid may leave a file on a node: a local job sees its own of /tmp, /var/tmp, /dev/shm and /run
# (job_sandbox.py), a Slurm job or a waived one the node's.
USUAL = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
REDISCOVER_AFTER_S = 300.0
# File systems holding no folder a job could leave a file in (kernel views), or too large to walk (network)
NOT_WALKED = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "nsfs", "securityfs", "debugfs", "tracefs", "pstore", "bpf",
    "configfs", "fusectl", "binfmt_misc", "autofs", "efivarfs", "selinuxfs", "rpc_pipefs", "nfsd",
    "nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "fuse.sshfs", "9p",
})

_lock = threading.Lock()
_found: tuple[str, ...] = ()
_found_at = float("-inf")


def _not_walked_mounts(mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    """Mount points of the file systems in NOT_WALKED."""
    points: set[str] = set()
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return points
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, fstype = left.split(), right.split()[:1]
        if len(fields) > 4 and fstype and fstype[0] in NOT_WALKED:
            # mount points escape a space, tab, newline and backslash as octal (\040 ...)
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def writable_by_all(root: str = "/") -> list[str]:
    """Every folder below root that others may write and reach (through folders others may pass), never
    below one already found (it is swept whole), never following a link, never inside a NOT_WALKED mount."""
    skipped = _not_walked_mounts()
    found = []
    for dirpath, dirnames, _files in os.walk(root, followlinks=False, onerror=lambda _exc: None):
        passable = []
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if path in skipped:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or not st.st_mode & stat.S_IXOTH:
                continue
            if st.st_mode & stat.S_IWOTH:
                found.append(path)
            else:
                passable.append(name)
        dirnames[:] = passable
    return found


def inside(path: str, folder: str) -> bool:
    """Whether path is folder or lies below it (both normalized, absolute)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def outermost(folders: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """folders without any that lies inside another of them (a walk of the outer one covers it)."""
    kept: list[str] = []
    for folder in sorted({os.path.normpath(f) for f in folders}):
        if not any(inside(folder, k) for k in kept):
            kept.append(folder)
    return tuple(kept)


def shared_folders() -> tuple[str, ...]:
    """The usual shared folders and every other one this node has (rediscovered every REDISCOVER_AFTER_S)."""
    global _found, _found_at
    with _lock:
        if time.monotonic() - _found_at > REDISCOVER_AFTER_S:
            started = time.monotonic()
            _found = outermost([*USUAL, *writable_by_all()])
            _found_at = time.monotonic()
            extra = sorted(set(_found) - set(USUAL))
            log.info("folders any job user may write: %s (%.1f s)%s", ", ".join(_found), _found_at - started,
                     f"; beyond the usual: {', '.join(extra)}" if extra else "")
        return _found


def forget() -> None:
    """Walk again at the next shared_folders() (a folder made since: tests, an admin's change)."""
    global _found_at
    with _lock:
        _found_at = float("-inf")
