"""Environments the service builds, end to end: real pip builds as jobs, real Megatron-Core runs on them."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from models import Environment
from models.base import utcnow
from service.core.db import session_scope
from service.core.settings import get_settings
from service.environments.build_steps import launch_builds, prune_builds, reconcile_builds
from service.environments.registry import get_environment, request_build
from tests.plugins.mcore_source import LR_OFF_BY_ONE, make_source
from tests.plugins.scheduler_harness import GOOD, PARITY, api_up, free_port, service_env, start, stop, wait_for

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(1200)]  # past the 300 s ceiling: real builds or many runs
CHECK = ["--config", "moe-fp32-router", "--dp", "2", "--steps", "6", "--save-step", "3",
         *[arg for w in GOOD for arg in ("--workaround", w)]]


def _env(name: str) -> Environment:
    with session_scope() as session:
        env = get_environment(session, name=name)
        session.expunge(env)
        return env


@pytest.mark.nightly  # the PR tier's real build is test_gate_on_main's (the main snapshot's wheel)
@pytest.mark.slurm
def test_run_on_a_service_built_environment_matches_run_local_on_that_build(
    committed_db: str, slurm: str, tmp_path: Path
) -> None:
    source = make_source(tmp_path / "mcore-src", local_version="lr.off.by.one", change=LR_OFF_BY_ONE)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_PUBLIC_URL=url)
    # a local source tree is admin-only (service/environments/build_policy.py)
    token = subprocess.run([*PARITY, "token", "create", "--name", "ci", "--scope", "admin"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        # one call: the environment is requested, the run queues and waits for the build
        submitted = subprocess.run(
            [*PARITY, "submit", "--url", url, "--token", token, *CHECK, "--requirement", str(source),
             "--wait", "--timeout", "900"], env=env, capture_output=True, text=True, timeout=1000,
        )
        out = submitted.stdout + submitted.stderr
        assert submitted.returncode == 1, out  # the deliberate change is a resume bug: fail
        assert "(new)" in submitted.stderr and "verdict: fail" in submitted.stdout
        run = httpx.get(f"{url}/api/v1/runs", params={"limit": 1}).json()["items"][0]
        built = httpx.get(f"{url}/api/v1/environments/{run['environment']}").json()
        # the installed distribution's version, read from its metadata (the build imports nothing it installed):
        # the local label says which build it is; the phase reports megatron.core.__version__ (below)
        assert built["state"] == "ready" and built["megatron_core"] == "0.16.1+lr.off.by.one", built
        assert any(line.startswith("megatron-core @ file://") for line in built["freeze"]), built["freeze"]
        assert any(line.startswith("torch==2.13.0") for line in built["freeze"])
        assert "lr-schedule-mismatch" in run["signatures"], run
        log = httpx.get(f"{url}/api/v1/environments/{run['environment']}/log")
        assert log.status_code == 200 and "+ megatron-core==0.16.1" in log.text
        assert "local source " in log.text  # hashed inside the build job, never by the API
        # the same local tree again is a new build: the API never reads the tree to know it is unchanged
        again = httpx.post(f"{url}/api/v1/environments", json={"requirements": [str(source)]},
                           headers={"Authorization": f"Bearer {token}"})
        assert again.status_code == 201 and again.json()["id"] != built["id"]
    finally:
        stop(scheduler)
        stop(api)
    local = subprocess.run(
        [*PARITY, "run-local", *CHECK, "--python", built["python"], "--json"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    result = json.loads(local.stdout)
    assert local.returncode == 1, local.stderr[-3000:]
    assert result["verdict"] == run["verdict"] == "fail"
    assert sorted(result["signatures"]) == sorted(run["signatures"])
    assert result["phases"]["train_and_save"]["info"]["megatron_core"] == "0.16.1"


@pytest.mark.nightly
def test_released_versions_build_a_bad_pin_fails_and_unused_builds_are_pruned(
    committed_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARITY_EXECUTOR", "local")
    get_settings.cache_clear()
    settings = get_settings()
    wanted = {"0.15.3": "megatron-core==0.15.3", "0.16.1": "megatron-core==0.16.1", "bad": "megatron-core==0.0.404"}
    names = {}
    with session_scope() as session:
        for key, line in wanted.items():
            names[key] = request_build(session, requirements=[line], settings=settings)[0].name
    with session_scope() as session:
        assert launch_builds(session, settings=settings, limit=3) == 3

    def finished() -> bool:
        with session_scope() as session:
            reconcile_builds(session)
        return all(_env(n).state in ("ready", "failed") for n in names.values())

    wait_for(finished, 900, "three builds", poll=2)
    for key in ("0.15.3", "0.16.1"):
        env = _env(names[key])
        assert env.state == "ready", env.error_message
        assert env.megatron_core == key and f"megatron-core=={key}" in env.freeze
        assert env.torch and env.torch.startswith("2.13.0")
        version = subprocess.run([env.python, "-c", "import megatron.core as m; print(m.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        assert version == key
    bad = _env(names["bad"])
    assert bad.state == "failed" and "megatron-core==0.0.404" in (bad.error_message or ""), bad.error_message

    # nothing used 0.15.3 for a while: its virtualenv goes, the row stays; asking again rebuilds it
    with session_scope() as session:
        session.execute(update(Environment).where(Environment.name == names["0.15.3"])
                        .values(last_used_at=utcnow() - timedelta(days=30)))
    with session_scope() as session:
        assert prune_builds(session, keep_days=14) == [names["0.15.3"]]
    pruned = _env(names["0.15.3"])
    assert pruned.state == "pruned" and not Path(pruned.folder or "").exists()
    assert _env(names["0.16.1"]).state == "ready"
    with session_scope() as session:
        env, created = request_build(session, requirements=[wanted["0.15.3"]], settings=settings)
        assert not created and env.state == "pending"
