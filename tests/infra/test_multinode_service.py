"""DP 2 over two Slurm nodes, one rank each, through the service: REST API + scheduler, real Megatron-Core."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.plugins.scheduler_harness import (
    GOOD,
    PARITY,
    api_up,
    free_port,
    jobs_gone,
    run_row,
    service_env,
    start,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron, pytest.mark.timeout(900)]
SPEC = {"config": "moe-fp32-router", "dp": 2, "nodes": 2, "steps": 6, "save_step": 3}
TERMINAL = {"passed", "failed", "error", "cancelled"}


def _post(url: str, token: str, spec: dict[str, Any]) -> int:
    reply = httpx.post(
        f"{url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"},
        json={"spec": spec, "environment": "default", "labels": {"branch": "main"}}, timeout=60,
    )
    assert reply.status_code == 202, reply.text
    assert reply.json()["spec"]["nodes"] == 2
    return int(reply.json()["id"])


def _finished(url: str, run_id: int) -> dict[str, Any] | None:
    run = httpx.get(f"{url}/api/v1/runs/{run_id}", timeout=30).json()
    return run if run["state"] in TERMINAL else None


def _rank_nodes(run: dict[str, Any]) -> dict[str, list[str | None]]:
    return {p["name"]: p["rank_nodes"] for p in run["phases"]}


@pytest.mark.nightly
def test_dp2_over_two_nodes_known_good_passes_known_bad_is_flagged(
    committed_db: str, on_two_nodes: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_PUBLIC_URL=url, SLURM_CONF=on_two_nodes)
    token = subprocess.run(
        [*PARITY, "token", "create", "--name", "ci", "--scope", "submit", "--track", "*"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: api_up(url), 120, "the API", alive=[api])
        # both at once: each job takes one CPU on each node, so they run side by side
        good_id = _post(url, token, {**SPEC, "workarounds": GOOD})
        bad_id = _post(url, token, SPEC)
        # and a job per phase: the resume rendezvous again in a new allocation over both nodes
        per_job_id = _post(url, token, {**SPEC, "workarounds": GOOD, "isolation": "job"})
        good = wait_for(lambda: _finished(url, good_id), 1200, "the known-good run", poll=2, alive=[api, scheduler])
        bad = wait_for(lambda: _finished(url, bad_id), 1200, "the known-bad run", poll=2, alive=[api, scheduler])
        per_job = wait_for(lambda: _finished(url, per_job_id), 1200, "the job-per-phase run", poll=2,
                           alive=[api, scheduler])

        assert good["state"] == "passed", (good["state"], good["error_message"], good["signatures"])
        assert good["verdict"] == "pass" and "nodes=2" in good["check_name"]
        assert bad["state"] == "failed" and bad["verdict"] == "fail", (bad["state"], bad["error_message"])
        assert "optimizer-index-misalignment" in bad["signatures"]
        # one rank on each node, in both phases (under isolation "process" one job runs both); the
        # known-bad save crashes (Bug A's assertion), so it has no resume phase
        assert _rank_nodes(good) == {"train_and_save": ["pnode1", "pnode2"], "resume": ["pnode1", "pnode2"]}
        assert _rank_nodes(bad)["train_and_save"] == ["pnode1", "pnode2"]
        assert all(p["executor"] == "slurm" for p in good["phases"] + bad["phases"])
        assert per_job["state"] == "passed", (per_job["state"], per_job["error_message"], per_job["signatures"])
        assert _rank_nodes(per_job) == {"train_and_save": ["pnode1", "pnode2"], "resume": ["pnode1", "pnode2"]}
        assert len({p["job_id"] for p in per_job["phases"]}) == 2
        summary = run_row(good_id).summary
        assert summary["phases"]["train_and_save"]["rank_nodes"] == ["pnode1", "pnode2"]
        assert summary["phases"]["resume"]["rank_nodes"] == ["pnode1", "pnode2"]
        multinode = summary["phases"]["train_and_save"]["info"]["multinode"]
        assert multinode["master_node"] == "pnode1" and multinode["master_addr"] == "10.77.0.11"

        metrics = httpx.get(f"{url}/api/v1/runs/{good_id}/metrics", timeout=30).json()
        resumed = [s for s in metrics["steps"] if s["loss_resumed"] is not None]
        assert [s["step"] for s in resumed] == [4, 5, 6]
        assert all(s["loss_abs_delta"] == 0.0 for s in resumed)

        page = httpx.get(f"{url}/runs/{good_id}", timeout=30)
        assert page.status_code == 200
        assert 'class="rank-nodes"' in page.text
        assert "rank 0: pnode1" in page.text and "rank 1: pnode2" in page.text
    finally:
        stop(scheduler)
        stop(api)
    for run_id in (good_id, bad_id, per_job_id):
        jobs_gone(run_id)
