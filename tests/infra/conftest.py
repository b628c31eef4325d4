"""Fixtures for the infrastructure tests: the repository root and the single-node Slurm."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
START_HINT = "start it with scripts/slurm-up.sh and `source /var/tmp/parity-slurm/env.sh`"


def slurm_unavailable_reason() -> str | None:
    """Why the real Slurm cannot be used from this process, or None when it can."""
    if not os.environ.get("SLURM_CONF"):
        return f"SLURM_CONF is not set; {START_HINT}"
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return f"sbatch/sinfo not on PATH; {START_HINT}"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed ({exc}); {START_HINT}"
    if out.returncode != 0:
        return f"sinfo failed: {(out.stderr or out.stdout).strip()}; {START_HINT}"
    if not any(state.strip("*~#") in {"idle", "mix", "alloc"} for state in out.stdout.split()):
        return f"no usable Slurm node (sinfo states: {out.stdout.split()}); {START_HINT}"
    return None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository checkout the tests run from."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """Skip unless a Slurm controller with a usable node answers; returns SLURM_CONF."""
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return os.environ["SLURM_CONF"]
