"""One job user per live job: a pool of users leased to jobs, and every process of a user killed when its job ends.

With one shared job user, two jobs live at the same time share a uid: each may signal, ptrace or read
(`/proc/<pid>/environ`, its granted folder) the other, and a daemon one leaves keeps that uid's rights
over every later job. Here PARITY_JOB_USER names a *pool*: the users `<name>-0`, `<name>-1`, …
(scripts/job-user.sh creates them). Each job that runs code from a build (a cold phase attempt, a
build, a warm-pool worker with every attempt it serves) gets a user of its own, leased when its folder
is handed over and given back only once the job is gone: then every process of that uid is killed
(kill(-1) as that uid: one atomic pass no fork escapes, on Slurm too, where proctrack/linuxproc lets a
`setsid` daemon leave the job) and its folders are the service's again, before the uid serves anyone
else. A lease is a file named after the user in PARITY_JOB_LEASE_FOLDER (default
`/run/parity-job-users`, root's only: the pool's users are the host's, so every scheduler on the host,
whatever its run folder, shares it), created exclusively (O_EXCL), so no two jobs ever hold one user
and a restarted scheduler finds its leases again; it names the folder that holds it. A lease whose
folder no longer exists (its run was deleted, its scheduler gone) is taken over once it is old enough
not to be a hand-over in progress (ORPHAN_AFTER_S), its processes killed first.

Without pool users (only `<name>` exists, or PARITY_JOB_USERS=0) every job runs as `<name>` as before,
and nothing is killed by uid (it would kill every other live job): the weaker mode docs/security.md
describes.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import psutil

from service.core.settings import Settings
from service.executors import node_folders
from service.executors.job_user import JobUser, JobUserError, job_user

log = logging.getLogger(__name__)
MAX_POOL = 4096  # pool users looked up at most (names stop at the first missing number anyway)
# a lease is taken over once its folder is gone and it is this old (a job's folder is made right after
# its lease: a fresh lease with no folder yet is a hand-over in progress)
ORPHAN_AFTER_S = 600.0


class NoFreeJobUser(RuntimeError):
    """Every user of the pool is leased to a live job: the job waits until one is given back."""


def pool_of(base: JobUser, size: int | None = None) -> list[JobUser]:
    """The users `<base>-0`, `<base>-1`, … that exist, in order, at most `size` (empty: the base user is shared)."""
    users = []
    for n in range(MAX_POOL if size is None else min(size, MAX_POOL)):
        name = f"{base.name}-{n}"
        try:
            pwd.getpwnam(name)
        except KeyError:
            break
        users.append(JobUser.lookup(name))
    return users


def _folder(settings: Settings) -> int:
    """The lease folder, opened (a directory fd; root's only, never through a link)."""
    folder = settings.job_lease_folder
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def holders(settings: Settings) -> dict[str, str]:
    """{user name: holder folder} of every lease (a lease being written reads as held by nobody known).

    Without PARITY_JOB_USER, or before the first lease, there are none (the folder is made by `lease`
    only: a scheduler that is not root never touches it)."""
    if not settings.job_user:
        return {}
    try:
        fd = os.open(settings.job_lease_folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return {}
    try:
        out = {}
        for name in os.listdir(fd):
            try:
                inner = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                continue
            with os.fdopen(inner) as fh:
                try:
                    out[name] = str(json.loads(fh.read() or "{}").get("holder", ""))
                except ValueError:
                    out[name] = ""
        return out
    finally:
        os.close(fd)


def _leased_name(settings: Settings, holder: Path) -> str | None:
    return next((name for name, held in holders(settings).items() if held == str(holder)), None)


def lease(settings: Settings, holder: Path) -> JobUser | None:
    """The user the job writing `holder` runs as: its lease, made now if it has none (None: no job user);
    a new one is a free user picked at random.

    A new lease first kills whatever its uid still runs (a scheduler that died before giving it back).
    NoFreeJobUser when every pool user is leased.
    """
    base = job_user(settings.job_user)
    if base is None:
        return None
    users = pool_of(base, settings.job_users)
    if not users:
        return base
    leased_to = holders(settings)
    held = next((name for name, folder in leased_to.items() if folder == str(holder)), None)
    if held is not None:
        return JobUser.lookup(held)
    # a random free user, never the lowest: a job that could predict which uid a later job of another tenant
    # gets could prepare for it (the review's setuid shell waited in /var/tmp for the victim's uid)
    secrets.SystemRandom().shuffle(users)
    fd = _folder(settings)
    try:
        for user in users:
            orphan = user.name in leased_to and _orphaned(fd, user.name, leased_to[user.name])
            if orphan:
                try:
                    os.unlink(user.name, dir_fd=fd)  # its folder is gone: no scheduler will give it back
                except FileNotFoundError:
                    pass  # another scheduler took it over first (O_EXCL below decides who has it)
                log.warning("job user %s: taking over the lease of %s, which no longer exists", user.name,
                            leased_to[user.name])
            try:
                out = os.open(user.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            except FileExistsError:
                continue
            with os.fdopen(out, "w") as fh:
                json.dump({"holder": str(holder), "since": time.time()}, fh)
            kill_user(user)
            if orphan:  # its scheduler never released it: what its last job left is removed now
                cancel_slurm_jobs_of(user)
                remove_files_of(user, spare=(settings.resolved_run_folder, settings.resolved_artifact_folder))
            return user
    finally:
        os.close(fd)
    raise NoFreeJobUser(f"PARITY_JOB_USER: all {len(users)} users of the pool {base.name}-0… are leased to live jobs "
                        f"(scripts/job-user.sh makes more: PARITY_JOB_USERS)")


def _orphaned(fd: int, name: str, holder: str) -> bool:
    # a lease being written names nobody yet: never taken over
    try:
        age = time.time() - os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False
    return bool(holder) and age > ORPHAN_AFTER_S and not os.path.lexists(holder)


def user_of(settings: Settings, holder: Path) -> JobUser | None:
    """The user a live job holding `holder` runs as (a warm worker's, for the attempts it serves): its
    lease, else the shared base user (no pool, or a job from before the pool)."""
    try:
        base = job_user(settings.job_user)
    except JobUserError:
        return None
    if base is None:
        return None
    held = _leased_name(settings, holder)
    return JobUser.lookup(held) if held is not None else base


def leased(settings: Settings, holder: Path) -> bool:
    """Whether the job writing `holder` holds a user of the pool."""
    return _leased_name(settings, holder) is not None


def stop(settings: Settings, holder: Path) -> int:
    """The job writing `holder` is over: kill every process of its leased user (none without a lease) and
    cancel its Slurm jobs; `release` then removes what it left in the node's shared folders."""
    held = _leased_name(settings, holder)
    if held is None:
        return 0
    try:
        user = JobUser.lookup(held)
    except JobUserError as exc:
        log.warning("not killing the processes of %s (lease of %s): %s", held, holder, exc)
        return 0
    left = kill_user(user)
    cancel_slurm_jobs_of(user)  # the review's `sbatch --begin=now+75` ran as the uid after its lease
    return left


def cancel_slurm_jobs_of(user: JobUser) -> None:
    """Cancel every Slurm job `user` has, queued or running (none can be another job's: the uid was leased
    to this one alone). Job users may not submit at all where scripts/slurm-up.sh's job_submit rule holds;
    this is for a cluster without it. No Slurm configured here: nothing to cancel (and no ctld to wait for)."""
    configured = os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")
    if shutil.which("scancel") is None or not configured:
        return
    try:
        done = subprocess.run(["scancel", "--quiet", "-u", user.name], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("scancel -u %s: %s", user.name, exc)
        return
    if done.returncode != 0 and "Invalid user" not in done.stderr:
        log.warning("scancel -u %s: %s", user.name, done.stderr.strip() or done.returncode)


def remove_files_of(user: JobUser, roots: tuple[str, ...] | None = None, *, spare: tuple[Path, ...] = ()) -> int:
    """Remove every entry `user` owns below `roots` (default: every folder any uid may write on this node,
    node_folders.py; a folder it owns, whole), except in and above `spare` (the service's run folder: the
    job's granted folders); how many. What a job's uid leaves there is removed before the uid serves anyone
    else (the review's setuid shells in /var/tmp and /dev/shm waited there for the uid's next job). Descends
    only where the uid may pass (nothing of it can lie below a folder it cannot enter), never follows a link
    nor leaves the root's file system."""
    groups = set(os.getgrouplist(user.name, user.gid))
    kept = {os.path.realpath(p) for p in spare}
    removed = 0
    for root in node_folders.shared_folders() if roots is None else roots:
        if any(node_folders.inside(root, k) for k in kept):
            continue  # a world-writable folder inside the run folder holds the job's outputs
        try:
            device = os.stat(root, follow_symlinks=False).st_dev
        except OSError:
            continue
        for _dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
            dirnames[:] = [d for d in dirnames if os.path.join(_dirpath, d) not in kept]
            for name in [*filenames, *dirnames]:
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                path = os.path.join(_dirpath, name)
                if st.st_uid == user.uid and not any(k == path or k.startswith(path + os.sep) for k in kept):
                    try:
                        if stat.S_ISDIR(st.st_mode):
                            shutil.rmtree(name, dir_fd=dirfd)
                        else:
                            os.unlink(name, dir_fd=dirfd)
                        removed += 1
                    except OSError as exc:
                        log.warning("%s's %s/%s not removed: %s", user.name, _dirpath, name, exc)
            dirnames[:] = [d for d in dirnames if _passable(dirfd, d, user.uid, groups, device)]
    if removed:
        log.info("removed %d entries %s left in the node's shared folders", removed, user.name)
    return removed


# SysV IPC objects outlive every process (a shared memory segment, a semaphore set, a message queue another
# job of the uid could attach to): a local job has an IPC namespace of its own (job_sandbox.py), a Slurm job or
# a waived one the node's, where what its uid made or owns is removed with the lease. {/proc/sysvipc file: ipcrm}
SYSV_IPC = {"shm": "--shmem-id", "sem": "--semaphore-id", "msg": "--queue-id"}


def ipc_of(uid: int, folder: Path = Path("/proc/sysvipc")) -> list[tuple[str, int]]:
    """(kind, id) of every SysV IPC object `uid` owns or created on this node (its IPC namespace)."""
    found = []
    for kind in SYSV_IPC:
        try:
            lines = (folder / kind).read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(header, line.split(), strict=False))
            ident = row.get("shmid") or row.get("semid") or row.get("msqid")
            if ident is not None and str(uid) in (row.get("uid"), row.get("cuid")):
                found.append((kind, int(ident)))
    return found


def remove_ipc_of(user: JobUser) -> int:
    """Remove every SysV IPC object `user` owns or created on this node; how many."""
    removed = 0
    for kind, ident in ipc_of(user.uid):
        try:
            done = subprocess.run(["ipcrm", SYSV_IPC[kind], str(ident)], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s's %s %d not removed: %s", user.name, kind, ident, exc)
            continue
        if done.returncode == 0:
            removed += 1
        else:
            log.warning("%s's %s %d not removed: %s", user.name, kind, ident, done.stderr.strip())
    if removed:
        log.info("removed %d SysV IPC objects %s left on the node", removed, user.name)
    return removed


def _passable(dirfd: int, name: str, uid: int, groups: set[int], device: int) -> bool:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if st.st_dev != device or not stat.S_ISDIR(st.st_mode):
        return False
    bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid in groups else stat.S_IXOTH
    return bool(st.st_mode & bit)


def release(settings: Settings, holder: Path) -> None:
    """Give `holder`'s user back to the pool: call after its folders are taken back (nothing of it runs
    any more: `stop` again, in case the job was still starting when it was stopped)."""
    held = _leased_name(settings, holder)
    if held is None:
        return
    stop(settings, holder)
    try:
        user = JobUser.lookup(held)
    except JobUserError:
        user = None
    if user is not None:
        # nothing of the uid runs now: nothing makes them again. Once per lease, here (a walk of the node's
        # shared folders: ~1 s on this project's busy test machine); its own folders (in the run folder, below
        # the node's /tmp where a clone in `mktemp -d` keeps it) are taken back already, never removed
        remove_files_of(user, spare=(settings.resolved_run_folder, settings.resolved_artifact_folder))
        remove_ipc_of(user)
    fd = _folder(settings)
    try:
        os.unlink(held, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _processes_of(uid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info["uids"]
        if uids is not None and uid in (uids.real, uids.effective, uids.saved) \
                and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def kill_user(user: JobUser, timeout_s: float = 10.0) -> int:
    """SIGKILL every process of `user` on this host; how many there were.

    The kill is kill(-1) made *as* that user (setpriv, then kill): the kernel signals every process the
    uid may signal, under one lock, so a process forking meanwhile cannot leave a child behind. Never for
    root or the service's own user (JobUser.lookup refuses both).
    """
    left = _processes_of(user.uid)
    if not left:
        return 0
    deadline = time.monotonic() + timeout_s
    while True:
        subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--",
                        "kill", "-9", "-1"], capture_output=True, timeout=30, check=False)
        time.sleep(0.02)  # SIGKILL lands at once, exiting takes a moment (zombies: the callers reap theirs)
        still = _processes_of(user.uid)
        if not still:
            break
        if time.monotonic() > deadline:
            log.warning("processes of %s still alive after SIGKILL: %s", user.name, [p.pid for p in still])
            for proc in still:  # uninterruptible ones (D state) go once their I/O is done
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            break
    log.info("killed %d processes left by %s", len(left), user.name)
    return len(left)
