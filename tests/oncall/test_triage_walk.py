"""Notification -> triage -> repro on real runs, as an on-call engineer new to the tool would walk it.

Real `parity serve` on a non-default port with no PARITY_PUBLIC_URL (links must use the address it
really listens on, which the scheduler reads from the run folder), real scheduler (local executor),
real Megatron-Core, a real webhook receiver, real Chromium. One check passes on the `default`
environment and then fails on `mcore-next` (the stock build with a resume bug injected at import:
checkpoint loading scales every tensor by 1.001), both on branch main: a regression.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest

from tests.plugins.browser import screenshot
from tests.plugins.scheduler_harness import GOOD, PARITY, api_up, free_port, service_env, start, stop, wait_for
from tests.plugins.webhook_receiver import start_receiver

pytestmark = [pytest.mark.browser, pytest.mark.megatron, pytest.mark.timeout(900)]
REGRESSED = Path(__file__).parent / "regressed_build"
SCREENS = Path(os.environ.get("PARITY_SCREENS_DIR", "/work/screens"))


def _token(env: dict[str, str], name: str, *scopes: str) -> str:
    args = [*PARITY, "token", "create", "--name", name, "--track", "*",
            *(a for s in scopes for a in ("--scope", s))]
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _submit(env: dict[str, str], environment: str, junit: Path) -> subprocess.CompletedProcess[str]:
    # no --url/--token: the CLI reads PARITY_SERVICE_URL / PARITY_TOKEN from env
    args = [*PARITY, "submit", "--config", "moe-fp32-router", "--dp", "1", "--steps", "4", "--save-step", "2",
            *(a for w in GOOD for a in ("--workaround", w)), "--environment", environment,
            "--label", "branch=main", "--label", f"commit={environment}-sha", "--wait", "--timeout", "900",
            "--junit", str(junit)]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=1000)


def _shot(page, name: str) -> None:
    path = screenshot(page, name)
    if SCREENS.parent.exists():
        SCREENS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENS / path.name)


@pytest.mark.nightly
def test_notification_to_triage_to_a_repro_that_reproduces(committed_db: str, tmp_path: Path, browser) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="local", PARITY_API_PORT="8000")  # the default port is not ours
    env.pop("PARITY_PUBLIC_URL", None)
    env.pop("PARITY_SERVICE_URL", None)
    admin, alice = _token(env, "admin", "admin"), _token(env, "alice", "submit", "read")
    receiver = start_receiver()
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = None
    context = browser.new_context(base_url=url, viewport={"width": 1400, "height": 900})
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        # start-up said that links rest on the listening address
        assert "PARITY_PUBLIC_URL is not set" in (tmp_path / "api.log").read_text()
        scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
        auth = {"Authorization": f"Bearer {admin}"}
        made = httpx.post(f"{url}/api/v1/notifications/channels", headers=auth, json={
            "name": "oncall", "kind": "webhook", "url": f"{receiver.url}/hook", "secret": "walk-webhook-secret-0123"})
        assert made.status_code == 201, made.text
        wrapper = tmp_path / "mcore-next-python"
        wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH="{REGRESSED}:$PYTHONPATH"\nexec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        made = httpx.post(f"{url}/api/v1/environments", headers=auth,
                          json={"name": "mcore-next", "python": str(wrapper)}, timeout=180)
        assert made.status_code == 201, made.text

        client_env = {**env, "PARITY_SERVICE_URL": url, "PARITY_TOKEN": alice}
        good = _submit(client_env, "default", tmp_path / "good.xml")
        assert good.returncode == 0, good.stdout + good.stderr
        assert "INFO httpx" not in good.stderr  # quiet without -v
        bad = _submit(client_env, "mcore-next", tmp_path / "bad.xml")
        assert bad.returncode == 1, bad.stdout + bad.stderr
        bad_id = int(bad.stdout.split()[1])
        triage_url = f"{url}/runs/{bad_id}/triage"
        failure = ET.parse(tmp_path / "bad.xml").getroot().find("testcase/failure")
        assert failure is not None and triage_url in (failure.text or "")

        # 1. the notification: its link works on this non-default port, and it says what happened in a line
        wait_for(lambda: len(receiver.got) >= 1, 120, "the webhook", alive=[api, scheduler])
        opened = receiver.got[0].json
        assert opened["event"] == "regression.opened" and opened["triage_url"] == triage_url
        assert opened["environment"] == "mcore-next" and opened["commit"] == "mcore-next-sha"
        assert "mcore-next" in opened["summary"] and opened["verdict"] == "fail" and opened["cause"]
        run_doc = httpx.get(f"{url}/api/v1/runs/{bad_id}").json()
        assert opened["first_divergent_step"] == run_doc["first_divergent_step"]

        # 2. triage: what changed (environment), the finding in a sentence
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(opened["triage_url"])
        assert f"Triage: run #{bad_id}" in page.locator("h1").inner_text()
        env_rows = page.locator("#env-diff tr.changed").all_inner_texts()
        assert any("environment" in r and "default" in r and "mcore-next" in r for r in env_rows), env_rows
        assert "track main" in page.locator("#compared").inner_text()
        # same interpreter underneath: no invented package differences
        assert "same pip freeze" in page.locator("#freeze-diff").inner_text()
        findings = page.locator("p.finding").all_inner_texts()
        assert findings, "no finding sentence"
        # the sentence names the tensors (dotted parameter names) and the ranks, and how they changed
        assert any(re.search(r"\b\w+(\.\w+)+(/\w+)?\b", f) and "rank" in f for f in findings), findings
        assert any("scaled ×1.001" in f for f in findings), findings
        _shot(page, "triage")
        if SCREENS.parent.exists():
            page.screenshot(path=str(SCREENS / "triage-top.png"))

        # 3. the repro, pasted as printed: the same verdict and signatures
        command = page.locator("#cmd-local").inner_text().strip()
        words = shlex.split(command)
        assert words[:4] == ["parity", "run-local", "--environment", "mcore-next"], command
        repro = subprocess.run([*PARITY, *words[1:], "--json"], env=client_env, capture_output=True, text=True,
                               timeout=900)
        result = json.loads(repro.stdout.strip().splitlines()[-1])
        assert (repro.returncode, result["verdict"]) == (1, run_doc["verdict"]), repro.stderr[-3000:]
        assert sorted(result["signatures"]) == sorted(run_doc["signatures"])

        # 4. the run page's charts: integer step ticks, real log-axis labels
        page.goto(f"/runs/{bad_id}")
        page.wait_for_function("() => window.parityCharts && window.parityCharts['chart-delta']")
        steps = page.evaluate("() => window.parityCharts['chart-loss'].axes[0]._values")
        assert steps and all(re.fullmatch(r"\d+", v) for v in steps if v is not None), steps
        logs = [v for v in page.evaluate("() => window.parityCharts['chart-delta'].axes[1]._values") if v]
        assert any(v != "0" for v in logs) and logs.count("0") <= 1, logs
        legend = page.locator("#chart-loss .u-legend").inner_text()
        assert "--" not in legend, legend  # a resting legend shows the last step's values
        _shot(page, "failing-run")
        if SCREENS.parent.exists():  # the charts at the top, at screen size
            page.screenshot(path=str(SCREENS / "failing-run-top.png"))
        page.goto("/")
        _shot(page, "overview")
        page.goto("/runs")
        assert "Check" in page.locator("#runs thead").inner_text()
        _shot(page, "runs-list")
        assert errors == []
    finally:
        context.close()
        if scheduler is not None:
            stop(scheduler)
        stop(api)
        receiver.stop()
