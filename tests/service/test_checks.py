"""Check identity and tracks through the API: which runs are compared with which."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.core.checks import check_key, check_name
from tests.plugins.verdict_helpers import finish

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4}
WORKAROUNDS = ["restore-adam-step", "realign-param-index"]
GOOD = {**SPEC, "workarounds": WORKAROUNDS}


def _queue(client: TestClient, headers: dict[str, str], spec: dict, **labels: str) -> dict:
    resp = client.post("/api/v1/runs", json={"spec": spec, "labels": labels}, headers=headers)
    assert resp.status_code == 202, resp.text
    return resp.json()


def _judged(client: TestClient, db: Session, headers: dict[str, str], spec: dict, verdict: str, **labels: str):
    run = _queue(client, headers, spec, **labels)
    finish(db, run["id"], verdict, ["optimizer-index-misalignment"] if verdict == "fail" else [])
    return client.get(f"/api/v1/runs/{run['id']}").json()


def test_check_key_is_the_canonical_spec() -> None:
    explicit = {**SPEC, "sharding": "dp_reshardable", "seed": 1234, "workarounds": ["load-no-grad"]}
    assert check_key(SPEC) == check_key({**SPEC, "sharding": "dp_reshardable", "seed": 1234})  # defaults filled
    assert check_key(GOOD) == check_key({**GOOD, "workarounds": list(reversed(WORKAROUNDS))})
    assert len({check_key(SPEC), check_key(GOOD), check_key({**SPEC, "dp": 1}), check_key(explicit)}) == 4
    assert check_name(GOOD) == (
        "moe-fp32-router dp=2 steps=8 save_step=4 workarounds=realign-param-index+restore-adam-step")


def test_different_spec_is_never_compared(client: TestClient, db_session: Session, make_token) -> None:
    headers = make_token("submit")
    good = _judged(client, db_session, headers, GOOD, "pass", branch="main")
    bad = _judged(client, db_session, headers, SPEC, "fail", branch="main")
    assert good["check_key"] != bad["check_key"] and good["track"] == bad["track"] == "main"
    assert bad["regression"] is False and bad["last_good_run_id"] is None and bad["compared_track"] is None
    other_dp = _judged(client, db_session, headers, {**GOOD, "dp": 1}, "fail", branch="main")
    assert other_dp["regression"] is False and other_dp["compared_track"] is None
    listed = client.get("/api/v1/runs", params={"check": good["check_key"], "track": "main"}).json()["items"]
    assert [r["id"] for r in listed] == [good["id"]]


def test_fail_after_pass_on_the_same_track_is_a_regression(
    client: TestClient, db_session: Session, make_token
) -> None:
    headers = make_token("submit")
    good = _judged(client, db_session, headers, SPEC, "pass", branch="main")
    _judged(client, db_session, headers, SPEC, "fail", branch="release")  # another track: not history
    bad = _judged(client, db_session, headers, SPEC, "fail", branch="main")
    assert bad["regression"] is True and bad["last_good_run_id"] == good["id"]
    assert bad["compared_track"] == "main" and bad["regression_text"] == "regression on main"
    again = _judged(client, db_session, headers, SPEC, "fail", branch="main")
    assert again["regression"] is False and again["failing_since_run_id"] == bad["id"]


def test_branch_without_history_is_compared_with_its_base_track(
    client: TestClient, db_session: Session, make_token
) -> None:
    headers = make_token("submit")
    main = _judged(client, db_session, headers, SPEC, "pass", branch="main")
    release = _judged(client, db_session, headers, SPEC, "fail", branch="release-1")
    pr = _judged(client, db_session, headers, SPEC, "fail", branch="pr-17")
    assert pr["track"] == "pr-17" and pr["compared_track"] == "main"
    assert pr["regression"] is True and pr["regression_text"] == "regression against main"
    assert pr["last_good_run_id"] == main["id"]
    # a base_branch label names another base: release-1 failed last, so nothing got worse there
    backport = _judged(client, db_session, headers, SPEC, "fail", branch="bp-3", base_branch="release-1")
    assert backport["compared_track"] == "release-1" and backport["regression"] is False
    assert release["regression"] is True  # release-1 itself had no history: judged against main
    # once the PR has history of its own, that history is used
    pr_again = _judged(client, db_session, headers, SPEC, "fail", branch="pr-17")
    assert pr_again["compared_track"] == "pr-17" and pr_again["regression"] is False


def test_track_is_the_environment_without_a_branch_label(
    client: TestClient, db_session: Session, make_token
) -> None:
    run = _queue(client, make_token("submit"), SPEC)
    assert run["track"] == "default"
    assert run["check_name"].startswith("moe-fp32-router dp=2 steps=8 save_step=4")
