"""A job's own HOME, TMPDIR, XDG folders and pip cache: inside the folder it is granted, fresh for every job.

A build that writes ~/.config/pip/pip.conf, user site-packages or a cache reaches only itself: what it
writes there counts in its quota and is gone for the next job (the review's poisoned pip config).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

# the subfolder of a granted folder that holds the job's own HOME and TMPDIR (made fresh by
# launcher.hand_over before every job)
PRIVATE = ".private"
VAR_TMP = "var-tmp"  # beside TMPDIR: a local job's own /var/tmp (service/executors/job_sandbox.py)


def private_environment(granted: Path) -> dict[str, str]:
    """The variables that point a job's home, temporary files, XDG folders and pip's cache into `granted`.

    pip reads no configuration file at all (PIP_CONFIG_FILE=/dev/null: pip's documented off switch; its
    options come only from PIP_* variables the scheduler passes on), and Python no user site-packages.
    """
    home = granted / PRIVATE / "home"
    return {
        "HOME": str(home), "TMPDIR": str(granted / PRIVATE / "tmp"), "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"), "PYTHONUSERBASE": str(home / ".local"),
        "PIP_CACHE_DIR": str(home / ".cache" / "pip"), "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1",
    }


def make_private(granted: Path) -> dict[str, str]:
    """Create the job's private folders in `granted` afresh (what an earlier job left is removed first).

    Called before `granted` is handed over, and by directory descriptor without following a link all
    the same: the service never creates anything where a link a job planted points.
    """
    granted.mkdir(mode=0o700, parents=True, exist_ok=True)
    top = os.open(granted, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            left = os.stat(PRIVATE, dir_fd=top, follow_symlinks=False)
        except FileNotFoundError:
            left = None
        if left is not None and stat.S_ISDIR(left.st_mode):
            shutil.rmtree(PRIVATE, dir_fd=top)  # fd-based: never follows a link left inside
        elif left is not None:
            os.unlink(PRIVATE, dir_fd=top)  # a file or a link: itself, never its target
        parts = ("home", "home/.config", "home/.cache", "home/.cache/pip", "home/.local", "home/.local/share",
                 "home/.local/state", "tmp", VAR_TMP)
        _make_dirs(top, PRIVATE, parts)
    finally:
        os.close(top)
    return private_environment(granted)


def _make_dirs(top: int, base: str, parts: tuple[str, ...]) -> None:
    os.mkdir(base, 0o700, dir_fd=top)
    for part in parts:
        *above, name = [base, *part.split("/")]
        fd = os.open(above[0], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        try:
            for step in above[1:]:
                inner = os.open(step, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
            os.mkdir(name, 0o700, dir_fd=fd)
        finally:
            os.close(fd)
