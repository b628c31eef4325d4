"""The system user jobs run as in the tests that need one (scripts/job-user.sh creates it; needs root).

Tests that use it are marked `job_user` (tests/conftest.py), so a contributor without root leaves them out
with `-m "not job_user"` (the fast lane does) and CI, with PARITY_REQUIRE_JOB_USER=1, never skips them."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

JOB_USER = "parity-job"


def require_job_user() -> None:
    """Skip (or, with PARITY_REQUIRE_JOB_USER=1, fail) unless this process can run jobs as JOB_USER."""
    why = None
    if os.geteuid() != 0:
        why = "the scheduler must be root to run jobs as another user"
    else:
        try:
            pwd.getpwnam(JOB_USER)
        except KeyError:
            why = f"no user {JOB_USER}: run scripts/job-user.sh (scripts/slurm-up.sh does)"
    if why:
        if os.environ.get("PARITY_REQUIRE_JOB_USER") == "1":
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def reachable_folder(prefix: str) -> Iterator[Path]:
    """A fresh folder under /var/tmp a job user can pass through (0711), removed afterwards.

    /tmp/pytest-of-root is 0700: a job user could not reach a run folder below it."""
    folder = Path("/var/tmp") / f"{prefix}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o711)
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
