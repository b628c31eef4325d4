"""The on-call path end to end on real runs: real scheduler (local executor), real Megatron-Core,
real webhook receiver on loopback, real Chromium.

One check (moe-fp32-router with both workarounds) on track main: it passes on the stock build,
fails on a "regressed build" (the stock build with a resume bug injected at import, see
regressed_build/sitecustomize.py), and passes again on the stock build.
"""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest

from tests.plugins.browser import screenshot
from tests.plugins.scheduler_harness import GOOD, PARITY, api_up, free_port, service_env, start, stop, wait_for
from tests.plugins.webhook_receiver import start_receiver

pytestmark = [pytest.mark.browser, pytest.mark.megatron]
SECRET = "on-call-webhook-shared-secret"
REGRESSED = Path(__file__).parent / "regressed_build"


def _token(env: dict[str, str], name: str, *scopes: str) -> str:
    args = [*PARITY, "token", "create", "--name", name, "--track", "*",
            *(a for s in scopes for a in ("--scope", s))]
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _submit(env: dict[str, str], url: str, token: str, environment: str, junit: Path):
    args = [*PARITY, "submit", "--url", url, "--token", token, "--config", "moe-fp32-router", "--dp", "1",
            "--steps", "4", "--save-step", "2", *(a for w in GOOD for a in ("--workaround", w)),
            "--environment", environment, "--label", "branch=main", "--wait", "--timeout", "900",
            "--junit", str(junit)]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=1000)


def _messages(receiver, n: int, alive: list) -> list:
    wait_for(lambda: len(receiver.got) >= n, 120, f"{n} webhook message(s)", alive=alive)
    return receiver.got


def test_regression_notified_acknowledged_and_resolved(committed_db: str, tmp_path: Path, browser) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="local", PARITY_PUBLIC_URL=url, PARITY_READS_REQUIRE_TOKEN="1",
                      PARITY_SESSION_SECRET="e2e-session-secret-0123456789")
    admin, alice = _token(env, "admin", "admin"), _token(env, "alice", "submit", "read")
    receiver = start_receiver()
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    context = browser.new_context(base_url=url)
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        auth = {"Authorization": f"Bearer {admin}"}
        channel = httpx.post(f"{url}/api/v1/notifications/channels", headers=auth, json={
            "name": "oncall", "kind": "webhook", "url": f"{receiver.url}/hook", "secret": SECRET})
        assert channel.status_code == 201, channel.text
        wrapper = tmp_path / "regressed-python"
        wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH="{REGRESSED}:$PYTHONPATH"\nexec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        made = httpx.post(f"{url}/api/v1/environments", headers=auth,
                          json={"name": "mcore-regressed", "python": str(wrapper)},
                          timeout=120)  # registration imports torch + megatron.core in that python
        assert made.status_code == 201, made.text

        good = _submit(env, url, alice, "default", tmp_path / "good.xml")
        assert good.returncode == 0, good.stdout + good.stderr
        check_line = next(ln for ln in good.stdout.splitlines() if ln.startswith("check "))
        bad = _submit(env, url, alice, "mcore-regressed", tmp_path / "bad.xml")
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "verdict: fail (regression on main)" in bad.stdout and check_line in bad.stdout  # the same check
        bad_id = int(bad.stdout.split()[1])
        failure = ET.parse(tmp_path / "bad.xml").getroot().find("testcase/failure")
        assert failure is not None and f"{url}/runs/{bad_id}/triage" in (failure.text or "")

        (opened,) = _messages(receiver, 1, [api, scheduler])
        assert opened.headers["x-parity-event"] == "regression.opened"
        mac = hmac.new(SECRET.encode(), opened.headers["x-parity-timestamp"].encode() + b"." + opened.body,
                       hashlib.sha256).hexdigest()
        assert opened.headers["x-parity-signature"] == f"sha256={mac}"
        triage_url = opened.json["triage_url"]
        assert triage_url == f"{url}/runs/{bad_id}/triage"

        page = context.new_page()
        page.goto(triage_url)  # the link from the message: log in, land on the triage page
        assert "/login" in page.url
        page.fill("input[name=token]", alice)
        page.click("#login-form button[type=submit]")
        page.wait_for_load_state("load")
        assert page.url == triage_url and f"Triage: run #{bad_id}" in page.locator("h1").inner_text()
        assert "moe-fp32-router" in page.locator("#issue-md").input_value()
        screenshot(page, "oncall-triage")
        page.goto("/")
        page.click("#open-regressions-link")
        page.wait_for_load_state("load")
        page.click(f"#regressions a[href='/regressions/{opened.json['regression']['id']}']")
        page.wait_for_load_state("load")
        page.fill("#ack-form input[name=note]", "resume bug in the regressed build; bisecting")
        page.click("#ack-form button[type=submit]")
        page.wait_for_load_state("load")
        assert page.locator("#reg-state").inner_text() == "acknowledged"
        acked = _messages(receiver, 2, [api, scheduler])[1]
        assert acked.headers["x-parity-event"] == "regression.acknowledged"
        assert acked.json["regression"]["acknowledged_by"] == "alice"

        fixed = _submit(env, url, alice, "default", tmp_path / "fixed.xml")
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        fixed_id = int(fixed.stdout.split()[1])
        resolved = _messages(receiver, 3, [api, scheduler])[2]
        assert resolved.headers["x-parity-event"] == "regression.resolved"
        assert resolved.json["regression"]["fixed_by_run_id"] == fixed_id
        page.reload()
        assert page.locator("#reg-state").inner_text() == "resolved"
        screenshot(page, "oncall-resolved")
        assert len(receiver.got) == 3  # one message per event, no duplicates
    finally:
        context.close()
        stop(scheduler)
        stop(api)
        receiver.stop()
