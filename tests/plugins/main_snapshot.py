"""Wheels built from the shared Megatron-LM main snapshot (with an injected pull request applied), cached
per snapshot hash under PARITY_CI_CACHE beside the shared 3.12 torch base, so a machine builds each once."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from jobs.selftest.pull_requests import BY_NAME, SNAPSHOT, source_tree
from service.environments import interpreters

CACHE = Path(os.environ.get("PARITY_CI_CACHE", "/var/tmp/parity-ci"))


def python312() -> str:
    pythons = interpreters.configured(None)
    if "3.12" not in pythons:
        pytest.skip("no Python 3.12 on this machine: Megatron-LM main requires it")
    return pythons["3.12"]


def main_wheel(name: str, change: str | None, python: str) -> Path:
    """The megatron-core wheel of the snapshot (with a PR applied), built once per snapshot hash."""
    digest = hashlib.sha256(SNAPSHOT.read_bytes()).hexdigest()[:16]
    out = CACHE / f"main-{digest}" / name
    wheels = sorted(out.glob("megatron_core-*.whl"))
    if wheels:
        return wheels[0]
    tree = source_tree(out / "src", BY_NAME[change] if change else None)
    subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(tree)], check=True)
    return sorted(out.glob("megatron_core-*.whl"))[0]
