"""PARITY_RUN_DISK_QUOTA for run attempts: how much an attempt folder may hold while its job runs.

Each job file is capped by RLIMIT_FSIZE (service/executors/launcher.py); many small files are not,
so the reconciler adds up the folder of every live attempt (at most every CHECK_INTERVAL_S each) and
stops one that is past the quota.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from models import Phase
from service.core.settings import Settings
from service.executors.job_user import folder_bytes

CHECK_INTERVAL_S = 10.0
_last_check: dict[int, float] = {}


def exceeded(phase: Phase, folder: Path, settings: Settings, *, now: float | None = None) -> str | None:
    """Why the attempt is over its quota ("disk quota exceeded: ..."), or None (also between checks)."""
    now = time.monotonic() if now is None else now
    if now - _last_check.get(phase.id, float("-inf")) < CHECK_INTERVAL_S:
        return None
    _last_check[phase.id] = now
    if len(_last_check) > 10_000:  # phases long over: forget them
        _last_check.clear()
    limit = settings.run_disk_quota_bytes
    used = folder_bytes(folder, limit=limit)
    if used <= limit:
        return None
    return (f"disk quota exceeded: the attempt folder holds more than {used} bytes, past "
            f"PARITY_RUN_DISK_QUOTA={settings.run_disk_quota} ({limit} bytes)")


def file_at_limit(folder: Path, settings: Settings) -> str | None:
    """Why a job that ended with an error may have been stopped by the per-file limit: a file that
    reached PARITY_RUN_DISK_QUOTA (RLIMIT_FSIZE makes the next write fail with EFBIG, which the code
    under test reports in its own words, e.g. torch's "unexpected pos"). None when there is none."""
    limit = settings.run_disk_quota_bytes
    if not folder.is_dir():
        return None
    for dirpath, _dirs, files, dirfd in os.fwalk(folder, follow_symlinks=False):
        for name in files:
            try:
                size = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
            if size >= limit:
                where = os.path.relpath(os.path.join(dirpath, name), folder)
                return (f"disk quota exceeded: {where} reached PARITY_RUN_DISK_QUOTA={settings.run_disk_quota} "
                        f"({limit} bytes), the most one file may hold")
    return None
