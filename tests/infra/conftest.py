"""Fixtures for the infrastructure tests: the repository root and the single-node Slurm."""

from __future__ import annotations

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
