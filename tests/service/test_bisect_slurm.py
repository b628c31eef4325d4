"""`parity bisect` through the real service and scheduler on real Slurm, over real Megatron-Core builds.

Six builds in order; build-4 introduces a resume bug into Megatron-Core (the DistributedOptimizer's
load resets every parameter's exp_avg_sq instead of restoring it) and build-5 keeps it. Each build is an
environment whose Python puts its own overlay of the megatron package first on the path (builds
0-3 have none: the installed release). The check already has a stored verdict on build-2, so the
bisect reuses it and runs only build-3 (pass) and build-4 (fail).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from models import Run
from service.core.db import session_scope
from service.environments.registry import get_environment
from tests.plugins.mcore_source import EXP_AVG_SQ_NOT_RESTORED, make_source
from tests.plugins.scheduler_harness import (
    PARITY,
    api_up,
    free_port,
    queue,
    register_environment,
    run_row,
    service_env,
    start,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron, pytest.mark.timeout(900)]
CHECK: dict[str, Any] = {
    "config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3, "workarounds": ["restore-adam-step"]}
BUILDS = [f"build-{i}" for i in range(6)]
FIRST_BAD = 4


def _python(folder: Path, overlay: Path | None) -> str:
    """An environment's Python: the service's interpreter with this build's overlay first on the path."""
    folder.mkdir(parents=True)
    path = f"export PYTHONPATH={overlay}${{PYTHONPATH:+:$PYTHONPATH}}\n" if overlay else ""
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\n{path}exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _envs_of(run_ids: list[int]) -> list[str]:
    with session_scope() as session:
        by_id = {get_environment(session, name=n).id: n for n in BUILDS}
        return [by_id[run_row(r).environment_id] for r in run_ids]


@pytest.mark.nightly
def test_bisect_finds_the_build_that_introduced_a_resume_bug(committed_db: str, slurm: str, tmp_path: Path) -> None:
    overlay = make_source(tmp_path / "overlay-bug", local_version="no.exp.avg.sq", change=EXP_AVG_SQ_NOT_RESTORED)
    for i, name in enumerate(BUILDS):
        register_environment(name, _python(tmp_path / name, overlay if i >= FIRST_BAD else None))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_PUBLIC_URL=url)
    token = subprocess.run([*PARITY, "token", "create", "--name", "ci", "--scope", "submit", "--track", "*"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    stored = queue(CHECK, labels={"branch": "release"}, environment="build-2")  # an earlier verdict
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        # generous: on the shared single-node Slurm the jobs may first wait behind other sessions' jobs
        wait_for(lambda: run_row(stored).finished_at, 3000, "the stored verdict", alive=[scheduler])
        assert run_row(stored).verdict == "pass", run_row(stored).error_message
        spec_args = ["--config", str(CHECK["config"]), "--dp", "1", "--steps", "6", "--save-step", "3",
                     "--workaround", "restore-adam-step"]
        between = [a for name in BUILDS[1:-1] for a in ("--between", name)]
        out = subprocess.run(
            [*PARITY, "bisect", "--url", url, "--token", token, *spec_args, "--good", BUILDS[0],
             "--bad", BUILDS[-1], *between, "--timeout", "3600"],
            env=env, capture_output=True, text=True, timeout=3700,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        doc = httpx.get(f"{url}/api/v1/bisects/{out.stdout.split()[1].rstrip(':')}", timeout=30).json()
        page = httpx.get(doc["links"]["dashboard"], timeout=30)
    finally:
        stop(scheduler)
        stop(api)
    assert doc["state"] == "found" and doc["first_bad"] == "build-4" and doc["last_good"] == "build-3"
    with session_scope() as session:
        own = list(session.scalars(select(Run.id).where(Run.labels.contains({"bisect": doc["id"]})).order_by(Run.id)))
        key = run_row(stored).check_key
        of_check = session.scalars(select(Run.id).where(Run.check_key == key)).all()
    # build-2 decided by the stored verdict; only build-3 and build-4 were run; nothing else of the check
    assert _envs_of(own) == ["build-3", "build-4"] and len(of_check) == 3
    assert (doc["runs_created"], doc["runs_reused"]) == (2, 1)
    good_run, bad_run = (run_row(r) for r in own)
    assert good_run.verdict == "pass", (good_run.signatures, good_run.error_message)
    assert bad_run.verdict == "fail" and "optimizer-moments-mismatch" in (bad_run.signatures or []), bad_run.signatures
    assert doc["environments"][2]["run"]["run_id"] == stored and doc["environments"][2]["run"]["reused"]
    assert f"first bad: build-4 {url}/runs/{bad_run.id}" in out.stdout
    assert f"last good: build-3 {url}/runs/{good_run.id}" in out.stdout
    assert "runs created: 2, stored verdicts reused: 1" in out.stdout
    assert page.status_code == 200 and "First bad: <strong>build-4</strong>" in page.text
