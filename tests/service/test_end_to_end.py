"""CI's path end to end: `parity serve` + `parity scheduler` on real Slurm, `parity submit --wait`."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest

from tests.plugins.scheduler_harness import GOOD, PARITY, api_up, free_port, service_env, start, stop, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.megatron, pytest.mark.timeout(600)]



def _submit(env: dict[str, str], url: str, token: str, junit: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        *PARITY, "submit", "--url", url, "--token", token, "--config", "moe-fp32-router", "--dp", "2",
        "--steps", "8", "--save-step", "4", "--label", "commit=abc123", "--label", "branch=main",
        "--wait", "--timeout", "400", "--junit", str(junit), *extra,
    ]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


def test_known_good_passes_and_known_bad_fails_as_another_check(
    committed_db: str, slurm: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_PUBLIC_URL=url)
    token = subprocess.run(
        [*PARITY, "token", "create", "--name", "ci", "--scope", "submit", "--track", "*"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        good_args = [arg for w in GOOD for arg in ("--workaround", w)]
        good = _submit(env, url, token, tmp_path / "good.xml", *good_args)
        assert good.returncode == 0, good.stdout + good.stderr
        assert "verdict: pass" in good.stdout
        assert f"{url}/runs/" in good.stdout and "/triage" not in good.stdout  # a clean pass has nothing to triage

        bad = _submit(env, url, token, tmp_path / "bad.xml")
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "verdict: fail" in bad.stdout and "optimizer-index-misalignment" in bad.stdout
        assert f"triage: {url}/runs/" in bad.stdout
        # without the workarounds it is another check: its failure is not a regression of the pass
        assert "REGRESSION" not in bad.stdout
        failure = ET.parse(tmp_path / "bad.xml").getroot().find("testcase/failure")
        assert failure is not None and "optimizer-index-misalignment" in failure.get("message", "")

        runs = httpx.get(f"{url}/api/v1/runs").json()["items"]
        bad_run, good_run = runs[0], runs[1]
        assert bad_run["check_key"] != good_run["check_key"] and bad_run["track"] == good_run["track"] == "main"
        assert f"check {good_run['check_key']}" in good.stdout and f"check {bad_run['check_key']}" in bad.stdout
        assert bad_run["regression"] is False and bad_run["last_good_run_id"] is None
        triage = httpx.get(bad_run["links"]["triage"])
        assert triage.status_code == 200
        assert "rank0.log" in triage.text and "AssertionError" in triage.text  # the traceback, one click away
        metrics = httpx.get(f"{url}/api/v1/runs/{good_run['id']}/metrics").json()
        resumed = [s for s in metrics["steps"] if s["loss_resumed"] is not None]
        assert [s["step"] for s in resumed] == [5, 6, 7, 8]
        assert all(s["loss_abs_delta"] == 0.0 and s["lr_abs_delta"] == 0.0 for s in resumed)

        timeout = subprocess.run(
            [*PARITY, "submit", "--url", url, "--token", token, "--config", "dense-bf16", "--dp", "1",
             "--steps", "4", "--save-step", "2", "--wait", "--timeout", "0.5"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert timeout.returncode == 2 and "timed out" in timeout.stderr
    finally:
        stop(scheduler)
        stop(api)

