"""Jobs run as someone else: PARITY_JOB_USER, the folders it may write, and the disk quota.

The code under test runs as a job user distinct from the service's user. That user owns only the
folder its job writes (an attempt folder, a build folder) and only while the job lives: the
scheduler hands it over before submitting (`grant`) and takes it back when the phase ends
(`take_back`, a symlink-safe walk that re-owns everything the job left). Around it:

- the run-folder tree above is the service's, traversable (x) but not listable by others, so a job
  reaches a folder only by its path;
- each run's folder is a gate: 0751 while one of its phases is live, 0750 otherwise, so a job of
  another run cannot even reach a finished run's attempts;
- everything the service's user owns (settings, the database password, the munge key, the
  service's checkout) stays unwritable and, where it is secret, unreadable: those files are the
  service's or root's, never the job user's.

What this does not separate: two jobs live at the same time both run as the job user, so each can
reach the other's granted folder and processes (docs/security.md says what closes that).

Without PARITY_JOB_USER nothing changes hands: folders stay 0700 and jobs run as the service's user
(the weaker mode docs/security.md describes).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import jobs

# the whole tree is the service's; others may only pass through (x), never list (r) or write
TRAVERSE_MODE = 0o751
GATE_CLOSED_MODE = 0o750
GRANTED_MODE = 0o2770  # job user's own; setgid: what it writes keeps the service's group (the API reads it)
TAKEN_BACK_MODE = 0o755  # the service's again; readable by the run's next phase (a resume loads the checkpoint)
PRIVATE_MODE = 0o700


# Can the job user reach what its jobs run? The interpreter (the service's venv, through its symlink to the
# real Python) and the project's own packages (an editable install lives in the checkout).
#
# A checkout in a private folder (mode 0700, as `mktemp -d` makes) hides all of it from the job user, and the
# job then dies before it can write a word ("Permission denied" on exec, nothing on stderr). Checked when the
# job user is looked up, so the phase fails with the folder named instead (scripts/setup.sh, run as root,
# makes those folders passable: o+x, nothing becomes listable).
def what_jobs_run() -> list[Path]:
    """The paths a job's process must reach: the interpreter as invoked and as resolved, and jobs/."""
    return [Path(sys.executable), Path(sys.executable).resolve(), Path(jobs.__file__).resolve().parent]


def blocking_folder(path: Path, *, name: str, uid: int, gid: int) -> Path | None:
    """The first folder on path's way that this user may not pass (no execute bit for it), or None."""
    groups = set(os.getgrouplist(name, gid))
    folders = [*reversed(path.parents)] + ([path] if path.is_dir() else [])
    for folder in folders:
        try:
            st = folder.stat()
        except OSError:
            return folder
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return folder
    return None


def unreachable(*, name: str, uid: int, gid: int) -> str | None:
    """Why jobs run as this user cannot start, naming the folder in the way; None when nothing blocks."""
    for path in what_jobs_run():
        folder = blocking_folder(path, name=name, uid=uid, gid=gid)
        if folder is not None:
            mode = oct(folder.stat().st_mode & 0o777) if folder.exists() else "missing"
            return (f"PARITY_JOB_USER: {name!r} cannot reach {path}: the folder {folder} ({mode}) does not let "
                    f"it pass. Run scripts/setup.sh as root (it adds o+x up the way), or chmod o+x {folder}")
    return None


class JobUserError(RuntimeError):
    """PARITY_JOB_USER names no usable user, or the scheduler may not act as it."""


@dataclass(frozen=True)
class JobUser:
    """The user jobs run as: its name, uid and primary gid, and the home it gets."""

    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str) -> JobUser:
        """The user named by PARITY_JOB_USER; refused when missing, root, or the scheduler's own user."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise JobUserError(f"PARITY_JOB_USER: no user named {name!r} on this host "
                               "(scripts/slurm-up.sh and the compose image create parity-job)") from None
        if entry.pw_uid == 0:
            raise JobUserError("PARITY_JOB_USER: root is not a job user")
        if entry.pw_uid == os.geteuid():
            raise JobUserError(f"PARITY_JOB_USER: {name!r} is the service's own user; jobs must run as another")
        if os.geteuid() != 0:
            raise JobUserError(f"PARITY_JOB_USER: switching to {name!r} needs a scheduler started as root "
                               f"(it runs as uid {os.geteuid()})")
        blocked = unreachable(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
        if blocked:
            raise JobUserError(blocked)
        return cls(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)

    def environment(self) -> dict[str, str]:
        """What the job's own identity variables say (its HOME is private to the job: job_home.private_environment)."""
        return {"USER": self.name, "LOGNAME": self.name}


def job_user(name: str | None) -> JobUser | None:
    """The configured job user (None: jobs run as the service's user)."""
    return JobUser.lookup(name) if name else None


def service_group(root: Path) -> int:
    """The group the run tree keeps: the run folder root's (the API's group in compose)."""
    try:
        return root.stat().st_gid
    except FileNotFoundError:
        return os.getegid()


def prepare_tree(root: Path, folder: Path, user: JobUser | None) -> None:
    """Create root and every folder down to `folder` (exclusive) for a job of `user`.

    Without a job user: 0700, the service's only. With one: 0751, so the job can pass through to
    the folder it is granted without being able to list or write anything on the way.
    """
    mode = TRAVERSE_MODE if user else PRIVATE_MODE
    chain = [root, *reversed([p for p in folder.parents if p.is_relative_to(root) and p != root])]
    for path in chain:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        current = stat.S_IMODE(path.lstat().st_mode)
        if current & 0o7777 & ~stat.S_ISGID != mode and not (user and _is_gate(path, root)):
            _chmod(path, mode)


def _chmod(path: Path, mode: int) -> None:
    # keep a setgid bit the run folder root hands down (compose: group parity, so the API can read)
    path.chmod(mode | (path.lstat().st_mode & stat.S_ISGID))


def _is_gate(path: Path, root: Path) -> bool:
    # run-<id> folders are opened and closed by open_gate/close_gate, never reset here
    return path.parent == root and path.name.startswith("run-")


def open_gate(gate: Path, user: JobUser | None) -> None:
    """Let the job user pass through a run's folder (while one of its phases is live)."""
    if user:
        gate.mkdir(mode=GATE_CLOSED_MODE, parents=True, exist_ok=True)
        _chmod(gate, TRAVERSE_MODE)


def close_gate(gate: Path, user: JobUser | None) -> None:
    """No job passes through a run's folder any more (none of its phases is live)."""
    if user and gate.is_dir() and not gate.is_symlink():
        _chmod(gate, GATE_CLOSED_MODE)


def grant(folder: Path, user: JobUser | None, *, root: Path) -> None:
    """Make `folder` (fresh, created here) and what the scheduler put in it the job user's."""
    folder.mkdir(mode=PRIVATE_MODE, parents=True, exist_ok=True)
    if user is None:
        if stat.S_IMODE(folder.lstat().st_mode) != PRIVATE_MODE:
            folder.chmod(PRIVATE_MODE)
        return
    group = service_group(root)
    _rechown(folder, user.uid, group, dir_mode=GRANTED_MODE)


def take_back(folder: Path, user: JobUser | None, *, root: Path, keep: tuple[Path, ...] = ()) -> None:
    """Re-own `folder` and everything the job left in it as the service's (never following a link).

    keep: subfolders left to the job (the submitit folder and private HOME of a job that still runs the
    next phase).
    """
    if user is None or not folder.is_dir() or folder.is_symlink():
        return
    _rechown(folder, os.geteuid(), service_group(root), dir_mode=TAKEN_BACK_MODE, keep=keep, unshare=True)


def _own_copy(dirfd: int, name: str, st: os.stat_result) -> None:
    """Give `name` an inode of its own: its bytes copied into a new file that replaces the name (by directory fd,
    never through a link). A hard link of it elsewhere (a job's file linked into the node's /tmp) keeps the job's
    inode and uid, so the lease's sweep of that uid's entries still finds it; re-owning the shared inode made it
    root's, writable by all, past the lease."""
    tmp = f".{name}.parity-own"[:255]
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dirfd)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        try:
            while chunk := os.read(src, 1 << 20):
                os.write(dst, chunk)
            os.fchmod(dst, stat.S_IMODE(st.st_mode) & 0o777)  # never setuid, setgid or sticky
        finally:
            os.close(dst)
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    finally:
        os.close(src)


def _rechown(folder: Path, uid: int, gid: int, *, dir_mode: int, keep: tuple[Path, ...] = (),
             unshare: bool = False) -> None:
    """chown every entry under folder by file descriptor: a link swapped in mid-walk is re-owned
    itself, never its target (os.fwalk does not follow links and hands out directory fds). `unshare`
    (taking back): a regular file with more than one hard link gets an inode of its own first (`_own_copy`)."""
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(top, uid, gid)
        os.fchmod(top, dir_mode | (os.fstat(top).st_mode & stat.S_ISGID))
    finally:
        os.close(top)
    skip = {k.name for k in keep if k.parent == folder}
    for _dirpath, dirnames, filenames, dirfd in os.fwalk(folder, follow_symlinks=False):
        if skip and os.path.samefile(_dirpath, folder):
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in [*dirnames, *filenames]:
            try:
                if unshare and name in filenames:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_uid != uid:
                        _own_copy(dirfd, name, st)
                os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed by the job while we walked


def folder_bytes(folder: Path, *, limit: int) -> int:
    """Disk space the files under folder take (allocated blocks, links not followed); stops once past limit."""
    total = 0
    if not folder.is_dir():
        return 0
    for _dirpath, dirnames, filenames, dirfd in os.fwalk(folder, follow_symlinks=False):
        for name in [*dirnames, *filenames]:
            try:
                total += os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                continue
        if total > limit:
            break
    return total


def group_name(gid: int) -> str:
    """A group's name for messages (its number when it has none)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
