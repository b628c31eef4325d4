"""A main track on a real Megatron-LM history: the track finds a resume bug, the bisect names its commit,
and a pull request branched before it is not blamed.

A local git repository made from the main snapshot (`../shared/megatron-lm/`): an import, a README
change, then the injected "LR scheduler: restore one step fewer than saved" (jobs/selftest/
pull_requests.py, scheduler-off-by-one), then another README change. A real API + scheduler (local
executor) builds each commit it needs with `pip wheel` on Python 3.12 (the shared 3.12 torch base)
and runs a one-check suite (moe-bf16, DP 2, 6 steps): the track at the README commit (pass), the
track at the head (fail), the automatic bisect on the one commit between, and the pull request:
three builds, four runs, a few minutes. The PR was branched before the bug and changes only the
README, so CI's test of it merged onto main's head has main head's Megatron-Core tree: it fails,
says "fails on main too (since <the bisected commit>)" and the gate passes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from xml.etree import ElementTree as ET

import httpx
import pytest
import yaml

from jobs.selftest.pull_requests import BY_NAME, SNAPSHOT, source_tree
from service.environments import interpreters
from tests.plugins.git_repo import Repo
from tests.plugins.main_snapshot import CACHE
from tests.plugins.scheduler_harness import PARITY, api_up, free_port, service_env, start, stop, wait_for

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(1800)]  # past the 300 s ceiling: real builds or many runs
BUG = BY_NAME["scheduler-off-by-one"]
CHECK = {"config": "moe-bf16", "dp": 2, "steps": 6, "save_step": 3, "workarounds": ["restore-adam-step"]}


def _finished_suite_run(http: httpx.Client, commit: str) -> dict:
    """Wait until the track main has run at commit and its suite run has a verdict."""
    def done() -> dict | None:
        track = http.get("/api/v1/tracks/main").json()
        if track["last_commit"] != commit or not track["last_suite_run_id"]:
            return None
        view = http.get(f"/api/v1/suite-runs/{track['last_suite_run_id']}").json()
        return view if view["state"] == "finished" else None
    return wait_for(done, 900, f"the track's suite run at {commit[:12]}", poll=2)


@pytest.mark.nightly
def test_the_main_track_finds_a_resume_bug_bisects_it_and_does_not_blame_a_pr(
    committed_db: str, tmp_path: Path,
) -> None:
    if not SNAPSHOT.exists():
        pytest.skip(f"the Megatron-LM main snapshot is not at {SNAPSHOT} (PARITY_MEGATRON_SNAPSHOT)")
    if "3.12" not in interpreters.configured(None):
        pytest.skip("no Python 3.12 on this machine: Megatron-LM main requires it")
    repo = Repo(tmp_path / "megatron-lm")
    source_tree(repo.path)
    repo.commit("Import Megatron-LM main d98e8a6", {})
    good = repo.commit("README: how to run the tests", {"README.md": (repo.path / "README.md").read_text() + "\nx\n"})
    repo.git("branch", "pr-docs")  # a pull request branched here, before the bug

    env = service_env(tmp_path, PARITY_EXECUTOR="local")
    builds = tmp_path / "runs" / "environments"
    builds.mkdir(parents=True)
    (CACHE / "pythons").mkdir(parents=True, exist_ok=True)
    (builds / "pythons").symlink_to(CACHE / "pythons")  # the shared 3.12 torch base, built once per machine
    prepared = subprocess.run([*PARITY, "pythons", "prepare", "3.12"], env=env, capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    token = subprocess.run([*PARITY, "token", "create", "--name", "ci", "--scope", "admin", "--scope", "submit"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "one.yaml").write_text(yaml.safe_dump({"name": "one", "checks": [{"name": "moe", "spec": CHECK}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = ["--url", url, "--token", token]

    def parity(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*PARITY, *args, *client], env=env, capture_output=True, text=True, timeout=1200)

    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        for args in (("suite", "apply", str(tmp_path / "one.yaml")),
                     ("source", "add", "mlm", str(repo.path), "--ref", "main"),
                     ("track", "add", "main", "--source", "mlm", "--suite", "one", "--every", "24h", "--auto-bisect")):
            done = parity(*args)
            assert done.returncode == 0, done.stdout + done.stderr
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        first = _finished_suite_run(http, good)
        assert first["verdict"] == "pass", first
        env_doc = http.get(f"/api/v1/environments/{first['environment']}").json()
        assert env_doc["source_commit"] == good and env_doc["source_commit_subject"] == "README: how to run the tests"
        assert env_doc["megatron_core"] == "0.20.0"  # main's own version: built from the commit, on 3.12

        BUG.apply(repo.path)  # the resume bug lands on main, then an unrelated commit after it
        bad = repo.commit(BUG.title, {})
        head = repo.commit("README: a second note", {"README.md": (repo.path / "README.md").read_text() + "y\n"})
        ran = parity("track", "run", "main")
        assert ran.returncode == 0, ran.stderr
        second = _finished_suite_run(http, head)
        assert second["verdict"] == "fail" and second["checks"][0]["run"]["regression"] is True, second
        key = second["checks"][0]["run"]["check_key"]

        # the automatic bisect builds the one commit between and names it, on the regression (and its alert)
        def named() -> dict | None:
            regs = http.get("/api/v1/regressions", params={"track": "main", "check": key}).json()
            return regs[0] if regs and regs[0]["first_bad_commit"] else None
        reg = wait_for(named, 900, "the bisect's first bad commit", poll=2)
        assert reg["first_bad_commit"] == bad and reg["first_bad_subject"] == BUG.title
        # `parity bisect --track` asks the same question again: every step is a stored verdict, no new run
        again = parity("bisect", "--track", "main", "--check", key)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"first bad commit: {bad} {BUG.title}" in again.stdout and "runs created: 0" in again.stdout

        # the PR (README only, branched before the bug) tested merged onto main's head: not blamed
        head_env = second["environment"]
        submitted = parity("submit", "--suite", "one", "--environment", head_env, "--label", "branch=pr-docs",
                           "--label", "base_branch=main", "--wait", "--junit", str(tmp_path / "pr.xml"))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        (case,) = ET.parse(tmp_path / "pr.xml").getroot().findall("testcase")
        skipped = case.find("skipped")
        assert skipped is not None and skipped.get("message") == f"fails on main too (since {bad[:12]})"
        assert bad != repo.git("rev-parse", "pr-docs")

        overview = http.get("/").text.split('id="tracks"', 1)[1].split("</table>", 1)[0]
        assert head[:12] in overview and bad[:12] in overview and BUG.title in overview
    finally:
        stop(scheduler)
        stop(api)
