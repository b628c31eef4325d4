"""The shipped CI jobs, run for real: a Megatron-Core tree with an injected resume bug fails the gate, a clean passes.

The jobs' own shell lines (docs/ci/*.yml) run with the base client (a fresh venv, tests/plugins/client_venv.py)
first on PATH against a real API + scheduler (local executor) on the test database: they build the tree's
wheel, upload it, the service builds an environment from it and runs the gate suite on it; commit statuses
go to a fake forge API on loopback that records them. The suite is the shipped gate's first check (DP 2
MoE with FP32 router params), so the whole test stays a few Megatron runs long.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import parse_qs
from xml.etree import ElementTree as ET

import pytest
import yaml

from tests.plugins.ci_jobs import ROOT, github_job, gitlab_job
from tests.plugins.client_venv import ClientVenv
from tests.plugins.mcore_source import LR_OFF_BY_ONE, make_source
from tests.plugins.scheduler_harness import PARITY, api_up, free_port, service_env, start, stop, wait_for
from tests.plugins.webhook_receiver import start_receiver

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(1200)]  # past the 300 s ceiling: real builds or many runs
HEAD_SHA = "1" * 40
MERGE_SHA = "2" * 40


def _statuses(forge, path: str) -> list[dict]:
    out = []
    for got in forge.got:
        if got.path == path:
            is_json = got.headers.get("content-type", "").startswith("application/json")
            out.append(got.json if is_json else {k: v[0] for k, v in parse_qs(got.body.decode()).items()})
    return out


@pytest.mark.nightly  # the PR tier's submit --suite --wheel path is test_gate_on_main
def test_the_documented_ci_jobs_gate_a_pull_request_on_its_own_build(
    committed_db: str, tmp_path: Path, base_client: ClientVenv
) -> None:
    client = base_client
    forge = start_receiver()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="local", PARITY_PUBLIC_URL=url)
    tokens = {scope: subprocess.run([*PARITY, "token", "create", "--name", f"ci-{scope}", "--scope", scope,
                                     "--track", "*"],
                                    env=env, capture_output=True, text=True, check=True).stdout.strip()
              for scope in ("admin", "submit")}
    gate = yaml.safe_load((ROOT / "suites" / "gate.yaml").read_text())
    suite_file = tmp_path / "gate.yaml"
    suite_file.write_text(yaml.safe_dump({**gate, "checks": gate["checks"][:1]}))
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    # what a CI runner gives the job: its tools (the base client) first on PATH, the forge's variables
    runner = {"PATH": f"{client.bin}:{os.environ['PATH']}", "HOME": str(tmp_path), "SOURCE_DATE_EPOCH": "1764547200"}
    for key in ("PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "SSL_CERT_FILE", "http_proxy", "https_proxy",
                "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        if key in os.environ:
            runner[key] = os.environ[key]
    log = tmp_path / "jobs.log"
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        applied = subprocess.run([str(client.bin / "parity"), "suite", "apply", str(suite_file), "--url", url,
                                  "--token", tokens["admin"]], capture_output=True, text=True)
        assert applied.returncode == 0, applied.stderr
        context = {
            "secrets.PARITY_TOKEN": tokens["submit"], "vars.PARITY_URL": url, "secrets.GITHUB_TOKEN": "gh-token",
            "github.repository_owner": "NVIDIA", "github.repository": "NVIDIA/Megatron-LM", "github.sha": MERGE_SHA,
            "github.event.pull_request.head.sha": HEAD_SHA, "github.head_ref": "pr-branch", "github.base_ref": "main",
            "github.server_url": "https://github.com", "github.run_attempt": "1",
        }
        gh_env = {**runner, "GITHUB_API_URL": forge.url, "GITHUB_REPOSITORY": "NVIDIA/Megatron-LM",
                  "GITHUB_SHA": MERGE_SHA}
        path = f"/repos/NVIDIA/Megatron-LM/statuses/{HEAD_SHA}"
        for name, change, code, state in (("bug", LR_OFF_BY_ONE, 1, "failure"), ("clean", None, 0, "success")):
            context["github.run_id"] = f"77{name}"  # each push of the PR is a workflow run of its own
            tree = make_source(tmp_path / name, local_version=f"pr.{name}", change=change)
            summary = tmp_path / f"{name}-summary.md"
            steps = github_job(context, cwd=tree, env={**gh_env, "GITHUB_STEP_SUMMARY": str(summary)}, log=log)
            assert [s.name for s in steps][0] == "Build the pull request's wheel"
            last = steps[-1]
            assert last.name == "Run the gate suite on that build" and last.returncode == code, log.read_text()[-6000:]
            states = [s["state"] for s in _statuses(forge, path)]
            assert states[-2:] == ["pending", state], states
            final = _statuses(forge, path)[-1]
            assert final["context"] == "parity/gate" and "/suite-runs/" in final["target_url"], final
            assert all(g.headers["authorization"] == "Bearer gh-token" for g in forge.got)
            junit = ET.parse(tree / "parity-junit.xml").getroot()
            cases = junit.findall("testcase")
            assert [c.get("name") for c in cases] == ["dp2-moe-fp32-router-gates"]
            lines = [x for x in summary.read_text().splitlines() if x.startswith("| dp2-moe-fp32-router-gates")]
            assert len(lines) == 1 and "/triage)" in lines[0]
            if name == "bug":
                failure = cases[0].find("failure")
                assert failure is not None and "lr-schedule-mismatch" in (failure.get("message") or "")
                assert "triage: " in (failure.text or "")
                assert "(lr-schedule-mismatch)" in lines[0] and "**fail**" in lines[0], lines
            else:
                assert junit.get("failures") is None and junit.get("errors") is None, ET.tostring(junit)
                assert "| pass" in lines[0], lines  # "pass (worked around)": the gate hides the open upstream bugs

        # GitLab: the same bug, through the GitLab job's lines; the status is form-encoded, "failed"
        gl_env = {**runner, "PARITY_TOKEN": tokens["submit"], "PARITY_SERVICE_URL": url, "GITLAB_TOKEN": "gl-token",
                  "CI_API_V4_URL": f"{forge.url}/api/v4", "CI_PROJECT_ID": "42", "CI_COMMIT_SHA": HEAD_SHA,
                  "CI_COMMIT_BRANCH": "mr-branch", "CI_DEFAULT_BRANCH": "main",
                  "CI_PIPELINE_URL": "https://gitlab.example/p/1", "CI_PIPELINE_ID": "1", "CI_JOB_ID": "2"}
        steps = gitlab_job(cwd=tmp_path / "bug", env=gl_env, log=log)
        assert steps[-1].returncode == 1, log.read_text()[-6000:]
        gl = _statuses(forge, f"/api/v4/projects/42/statuses/{HEAD_SHA}")
        assert [s["state"] for s in gl] == ["running", "failed"] and gl[-1]["name"] == "parity/gate", gl
        assert "lr-schedule-mismatch" in (tmp_path / "bug" / "parity-summary.md").read_text()
    finally:
        stop(scheduler)
        stop(api)
        forge.stop()
