"""Fixtures for the infrastructure tests: the repository root, the single-node Slurm and a two-node one."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository checkout the tests run from."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def slurm_cluster(slurm: str) -> str:
    """SLURM_CONF of the live Slurm (the root `slurm` fixture: a skip, or a failure under PARITY_REQUIRE_SLURM=1)."""
    return slurm


# --- multi-node: a separate two-node Slurm (scripts/slurm-multinode-up.sh), never the shared one ---
TWO_NODE_DIR = Path(os.environ.get("PARITY_SLURM2_DIR", "/var/tmp/parity-slurm2"))


def _two_node_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the two-node Slurm needs root (network and UTS namespaces)"
    missing = [tool for tool in ("slurmctld", "slurmd", "ip", "nsenter", "unshare") if shutil.which(tool) is None]
    if missing and os.environ.get("PARITY_SLURM_NO_APT") == "1":
        return f"missing {', '.join(missing)} and PARITY_SLURM_NO_APT=1"
    return None


@pytest.fixture(scope="session")
def slurm_two_nodes() -> Iterator[str]:
    """SLURM_CONF of a two-node Slurm (pnode1, pnode2) this session starts and stops.

    Skips when it cannot start; fails instead under PARITY_REQUIRE_SLURM=1 (CI).
    """
    reason = _two_node_unavailable()
    up = None
    if reason is None:
        up = subprocess.run(
            [str(REPO_ROOT / "scripts" / "slurm-multinode-up.sh"), "--nodes", "2"],
            env={**os.environ, "PARITY_SLURM2_DIR": str(TWO_NODE_DIR)},
            capture_output=True, text=True, timeout=600,
        )
        if up.returncode != 0:
            reason = f"scripts/slurm-multinode-up.sh failed ({up.returncode}):\n{(up.stdout + up.stderr)[-3000:]}"
    if reason is not None:
        if os.environ.get("PARITY_REQUIRE_SLURM") == "1":
            pytest.fail(f"the two-node Slurm is required here: {reason}")
        pytest.skip(reason)
    try:
        yield str(TWO_NODE_DIR / "etc" / "slurm.conf")
    finally:
        subprocess.run(
            [str(REPO_ROOT / "scripts" / "slurm-multinode-down.sh")],
            env={**os.environ, "PARITY_SLURM2_DIR": str(TWO_NODE_DIR)},
            capture_output=True, text=True, timeout=300, check=False,
        )


@pytest.fixture
def on_two_nodes(slurm_two_nodes: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Within the test, Slurm commands, submitit and spawned services talk to the two-node cluster."""
    import submitit

    monkeypatch.setenv("SLURM_CONF", slurm_two_nodes)
    # submitit's job-state cache is per process and keyed by job id alone: another cluster's ids collide
    submitit.SlurmJob.watcher.clear()
    yield slurm_two_nodes
    submitit.SlurmJob.watcher.clear()
