"""scripts/*.sh: valid bash, slurm-up.sh on a live cluster is a fast no-op, multinode-up checks its options."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
SHELL_FILES = sorted(
    str(p.relative_to(ROOT)) for p in [*SCRIPTS.glob("*.sh"), *(ROOT / "docker").glob("*.sh"), *ROOT.glob(".ci/run*")]
)


@pytest.mark.parametrize("script", SHELL_FILES)
def test_script_is_valid_bash(script: str) -> None:
    result = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_slurm_down_rejects_unknown_flags() -> None:
    result = subprocess.run([str(SCRIPTS / "slurm-down.sh"), "--everything"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage:" in result.stderr


def _pids(run_dir: Path) -> dict[str, str]:
    names = ("slurmctld", "slurmd", "slurmdbd")
    return {name: (run_dir / f"{name}.pid").read_text().strip() for name in names}


@pytest.mark.slurm
def test_second_slurm_up_is_a_fast_no_op(slurm_cluster: str) -> None:
    state_dir = Path(slurm_cluster).parent.parent
    if not (state_dir / "run" / "slurmctld.pid").exists() or os.geteuid() != 0:
        pytest.skip(f"this Slurm was not started by scripts/slurm-up.sh as root ({state_dir})")
    before = _pids(state_dir / "run")

    started = time.monotonic()
    result = subprocess.run(
        [str(SCRIPTS / "slurm-up.sh")],
        env={**os.environ, "PARITY_SLURM_DIR": str(state_dir), "PARITY_SLURM_NO_APT": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stdout + result.stderr
    for daemon in ("mariadbd", "slurmdbd", "slurmctld", "slurmd"):
        assert f"{daemon} already running" in result.stdout, result.stdout
    assert "READY" in result.stdout
    assert _pids(state_dir / "run") == before, "a second start restarted a daemon"
    # only checks, never a wait for a daemon to come up (a bound a loaded host cannot flake: the same pids say
    # nothing restarted)
    assert elapsed < 60, f"second start took {elapsed:.1f}s"


@pytest.mark.parametrize("cpus", ["0", "two", "-1"])
def test_slurm_multinode_up_rejects_bad_node_cpus_before_touching_anything(cpus: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(SCRIPTS / "slurm-multinode-up.sh"), "--nodes", "2"],
        env={**os.environ, "PARITY_SLURM2_CPUS": cpus, "PARITY_SLURM2_DIR": str(tmp_path / "state")},
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "PARITY_SLURM2_CPUS" in result.stderr
    assert not (tmp_path / "state").exists()
