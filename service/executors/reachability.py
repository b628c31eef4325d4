"""Can the job user reach what its jobs run? The interpreter (the service's venv, through its symlink to the
real Python) and the project's own packages (an editable install lives in the checkout).

A checkout in a private folder (mode 0700, as `mktemp -d` makes) hides all of it from the job user, and the
job then dies before it can write a word ("Permission denied" on exec, nothing on stderr). Checked when the
job user is looked up, so the phase fails with the folder named instead (scripts/setup.sh, run as root,
makes those folders passable: o+x, nothing becomes listable)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import jobs


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
