"""Commit statuses for `parity submit --github-status | --gitlab-status`, posted to a fake forge on loopback."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from service.cli.client.forge import from_environment
from tests.plugins.webhook_receiver import start_receiver


def test_github_statuses_carry_state_link_and_context(monkeypatch: pytest.MonkeyPatch) -> None:
    forge = start_receiver()
    try:
        for key, value in {"GITHUB_API_URL": forge.url, "GITHUB_REPOSITORY": "o/r", "GITHUB_SHA": "m" * 40,
                           "GITHUB_TOKEN": "tok"}.items():
            monkeypatch.setenv(key, value)
        gh = from_environment("github", context="parity/gate", sha="h" * 40)
        assert gh is not None
        for outcome in ("pending", "pass", "fail", "error"):
            assert gh.post(outcome, url="http://parity/suite-runs/abc", description="x" * 300)
        assert {g.path for g in forge.got} == {f"/repos/o/r/statuses/{'h' * 40}"}
        assert [g.json["state"] for g in forge.got] == ["pending", "success", "failure", "error"]
        first = forge.got[0]
        assert first.json["context"] == "parity/gate" and first.json["target_url"] == "http://parity/suite-runs/abc"
        assert len(first.json["description"]) == 140 and first.headers["authorization"] == "Bearer tok"
        forge.status = 500  # a forge that refuses is a warning, not the job's verdict
        assert not gh.post("pass", url="http://parity", description="d")
    finally:
        forge.stop()


def test_gitlab_statuses_map_to_its_states(monkeypatch: pytest.MonkeyPatch) -> None:
    forge = start_receiver()
    try:
        for key, value in {"CI_API_V4_URL": f"{forge.url}/api/v4", "CI_PROJECT_ID": "7", "CI_COMMIT_SHA": "c" * 40,
                           "GITLAB_TOKEN": "gl"}.items():
            monkeypatch.setenv(key, value)
        gl = from_environment("gitlab", context="parity/gate")
        assert gl is not None
        for outcome in ("pending", "pass", "fail", "error"):
            gl.post(outcome, url="http://parity/runs/1/triage", description="d")
        assert {g.path for g in forge.got} == {f"/api/v4/projects/7/statuses/{'c' * 40}"}
        forms = [{k: v[0] for k, v in parse_qs(g.body.decode()).items()} for g in forge.got]
        assert [f["state"] for f in forms] == ["running", "success", "failed", "failed"]
        assert forms[0]["name"] == "parity/gate" and forge.got[0].headers["private-token"] == "gl"
    finally:
        forge.stop()


def test_a_missing_forge_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    with pytest.raises(SystemExit, match="GITHUB_TOKEN"):
        from_environment("github", context="c")
    assert from_environment(None, context="c") is None
