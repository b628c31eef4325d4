"""The `slurm` fixture: the live single-node Slurm of scripts/slurm-up.sh. A pytest plugin (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def slurm_unavailable_reason() -> str | None:
    """Why the real single-node Slurm cannot be used, or None when a node answers."""
    if not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
        return "SLURM_CONF unset or sbatch missing: run scripts/slurm-up.sh and source its env.sh"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    if out.returncode != 0 or not any(s.strip("*~#") in {"idle", "mix", "alloc", "comp"} for s in out.stdout.split()):
        return f"no usable Slurm node: {(out.stdout + out.stderr).strip()}"
    return None


@pytest.fixture(scope="session")
def slurm() -> str:
    """SLURM_CONF of a live Slurm; skips without one, fails instead when PARITY_REQUIRE_SLURM=1 (CI)."""
    reason = slurm_unavailable_reason()
    if reason:
        if os.environ.get("PARITY_REQUIRE_SLURM") == "1":
            pytest.fail(f"Slurm is required here: {reason}")
        pytest.skip(reason)
    return os.environ["SLURM_CONF"]
