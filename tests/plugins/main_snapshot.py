"""Wheels built from the shared Megatron-LM main snapshot (with an injected pull request applied), cached
per snapshot hash under PARITY_CI_CACHE beside the shared 3.12 torch base, so a machine builds each once.

`python -m tests.plugins.main_snapshot` builds what the PR tier's main-snapshot tests use (the base and
their wheels) ahead of them: scripts/test.sh starts it beside the first tests, so a machine without the
cache does not pay its ~3 minutes inside the one test that needs it. Each piece is built under a lock, so
the test and this never build the same thing twice or read a half-written one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
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
    out.mkdir(parents=True, exist_ok=True)
    with (out.parent / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building it: wait, then take its wheel
        wheels = sorted(out.glob("megatron_core-*.whl"))
        if wheels:
            return wheels[0]
        tree = source_tree(out / "src", BY_NAME[change] if change else None)
        # built aside and moved in whole: a build cut short (Ctrl-C) never leaves a wheel to be taken
        with tempfile.TemporaryDirectory(dir=out.parent) as aside:
            subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", aside, str(tree)],
                           check=True)
            built = next(Path(aside).glob("megatron_core-*.whl"))
            os.replace(built, out / built.name)
        return sorted(out.glob("megatron_core-*.whl"))[0]


# the PR tier's second injected PR, run through only the gate check that catches it (a cheap check)
SLICE_PR = "layerwise-fp32-masters-not-saved"
# the wheels the PR tier's tests build (tests/service/test_gate_on_main.py: clean main, the index-map PR
# and the slice's PR)
PR_TIER_WHEELS = (("clean", None), ("index-map-global-position", "index-map-global-position"),
                  (SLICE_PR, SLICE_PR))


def prepare_base(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`parity pythons prepare 3.12` with the builds folder env's PARITY_RUN_FOLDER names, its pythons/ the cache's."""
    builds = Path(env["PARITY_RUN_FOLDER"]) / "environments"
    builds.mkdir(parents=True, exist_ok=True)
    (CACHE / "pythons").mkdir(parents=True, exist_ok=True)
    if not (builds / "pythons").exists():
        (builds / "pythons").symlink_to(CACHE / "pythons")
    return subprocess.run([sys.executable, "-m", "service.cli.main", "pythons", "prepare", "3.12"], env=env,
                          capture_output=True, text=True)


def _prepare_all() -> int:
    python = interpreters.configured(None).get("3.12")
    if python is None or not SNAPSHOT.exists():
        print("main snapshot: no Python 3.12 or no snapshot here; nothing to prepare")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        done = prepare_base({**os.environ, "PARITY_RUN_FOLDER": str(Path(tmp) / "runs")})
    print(done.stdout + done.stderr, end="")
    for name, change in PR_TIER_WHEELS:
        print(f"main snapshot wheel {name}: {main_wheel(name, change, python)}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(_prepare_all())
