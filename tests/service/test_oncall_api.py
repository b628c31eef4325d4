"""Regressions as objects, known upstream failures and on-call metrics, through the API."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from models import Environment, Run
from tests.plugins.verdict_helpers import finish

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4}
BUG_A = "optimizer-index-misalignment"
ISSUE = "https://github.com/NVIDIA/Megatron-LM/issues/2777"


def _run(client: TestClient, db: Session, headers: dict[str, str], verdict: str, signatures: list[str] | None = None,
         mcore: str = "0.16.1", **labels: str) -> dict:
    labels = labels or {"branch": "main"}
    run = client.post("/api/v1/runs", json={"spec": SPEC, "labels": labels}, headers=headers).json()
    row = db.get(Run, run["id"])
    assert row is not None
    row.summary = {"packages": {"megatron_core": mcore}}  # as record_packages leaves it before the verdict
    finish(db, run["id"], verdict, signatures if signatures is not None else ([BUG_A] if verdict == "fail" else []))
    return client.get(f"/api/v1/runs/{run['id']}").json()


def test_regression_opens_gathers_acknowledges_and_resolves(
    client: TestClient, db_session: Session, make_token
) -> None:
    submit = make_token("submit")
    good = _run(client, db_session, submit, "pass")
    assert client.get("/api/v1/regressions").json() == []
    bad = _run(client, db_session, submit, "fail")
    later = _run(client, db_session, submit, "fail", ["checkpoint-save-crash"])
    _run(client, db_session, submit, "error")  # couldn't tell (infrastructure's): joins nothing, resolves nothing
    _run(client, db_session, submit, "fail", branch="other")  # another track: its own history, nothing to break
    (reg,) = client.get("/api/v1/regressions", params={"state": "open"}).json()
    assert reg["first_failing_run_id"] == bad["id"] and reg["last_good_run_id"] == good["id"]
    assert reg["failing_run_ids"] == [bad["id"], later["id"]] and reg["latest_failing_run_id"] == later["id"]
    assert reg["track"] == "main" and reg["check_key"] == bad["check_key"]
    assert reg["links"]["triage"] == f"http://testserver/runs/{bad['id']}/triage"
    alice = make_token("submit", name="alice")
    # the owner is the token's name: a free-text owner is refused (anyone could acknowledge as anyone)
    spoofed = client.post(f"/api/v1/regressions/{reg['id']}/acknowledge", headers=submit, json={"who": "alice"})
    assert spoofed.status_code == 422 and spoofed.json()["field"] == "who"
    ack = client.post(f"/api/v1/regressions/{reg['id']}/acknowledge", headers=alice,
                      json={"note": "Bug A again", "upstream_url": ISSUE})
    assert ack.status_code == 200, ack.text
    assert ack.json()["acknowledged_by"] == "alice" and ack.json()["upstream_url"] == ISSUE
    assert client.get("/api/v1/regressions", params={"state": "open"}).json() == []
    assert [r["id"] for r in client.get("/api/v1/regressions", params={"state": "unresolved"}).json()] == [reg["id"]]
    fixed = _run(client, db_session, submit, "pass")
    done = client.get(f"/api/v1/regressions/{reg['id']}").json()
    assert done["state"] == "resolved" and done["fixed_by_run_id"] == fixed["id"] and done["resolved_at"]
    again = client.post(f"/api/v1/regressions/{reg['id']}/acknowledge", headers=submit, json={})
    assert again.status_code == 409
    assert client.get("/api/v1/regressions", params={"state": "maybe"}).status_code == 422
    # the next failure after the fix is a new regression
    _run(client, db_session, submit, "fail")
    assert len(client.get("/api/v1/regressions", params={"state": "open"}).json()) == 1


def test_known_failure_is_apart_from_fail_and_fixed_is_flagged(
    client: TestClient, db_session: Session, make_token
) -> None:
    admin, submit = make_token("admin"), make_token("submit")
    bad_range = client.post("/api/v1/known-failures", headers=admin,
                            json={"signature": BUG_A, "mcore_versions": "<=zero", "link": ISSUE})
    assert bad_range.status_code == 422 and bad_range.json()["field"] == "mcore_versions"
    unknown = client.post("/api/v1/known-failures", headers=admin, json={"signature": "nope", "link": ISSUE,
                                                                         "environments": ["default"]})
    assert unknown.status_code == 422 and BUG_A in unknown.json()["detail"]
    assert client.post("/api/v1/known-failures", headers=submit, json={}).status_code in (403, 422)
    entry = client.post("/api/v1/known-failures", headers=admin,
                        json={"signature": BUG_A, "mcore_versions": "<=0.16.1", "link": ISSUE}).json()
    _run(client, db_session, submit, "pass")
    known = _run(client, db_session, submit, "fail")
    assert known["verdict"] == "known-failure" and known["state"] == "failed"
    assert known["regression"] is False
    assert known["known_failures"] == [{"id": entry["id"], "signature": BUG_A, "link": ISSUE}]
    assert client.get("/api/v1/regressions").json() == []
    overview = client.get("/").text
    cell = overview[overview.index(f'data-run-id="{known["id"]}"') - 80:]
    assert "v-known-failure" in cell[:200] and f'href="{ISSUE}"' in cell[:1500]
    assert "1 known failure" in overview
    # a build outside the range: the same signature is a real failure and a regression
    newer = _run(client, db_session, submit, "fail", mcore="0.17.0", branch="next")
    assert newer["verdict"] == "fail" and newer["compared_track"] == "main" and newer["regression"] is True
    # another signature next to the known one: not explained, a plain fail
    mixed = _run(client, db_session, submit, "fail", [BUG_A, "lr-schedule-mismatch"], branch="pr-1")
    assert mixed["verdict"] == "fail"
    # the known failure stops happening on that check and track: flagged fixed?
    _run(client, db_session, submit, "fail")
    fixed = _run(client, db_session, submit, "pass")
    assert fixed["fixed_known"] == [{"id": entry["id"], "signature": BUG_A, "link": ISSUE}]
    overview = client.get("/").text
    cell = overview[overview.index(f'data-run-id="{fixed["id"]}"'):]
    assert "fixed?" in cell[:1500] and "v-pass" in overview
    listed = client.get("/api/v1/runs", params={"verdict": "known-failure"}).json()["items"]
    assert {r["id"] for r in listed} >= {known["id"]}
    retired = client.post(f"/api/v1/known-failures/{entry['id']}/retire", headers=admin).json()
    assert retired["retired_at"] is not None and client.get("/api/v1/known-failures").json() == []
    after = _run(client, db_session, submit, "fail")
    assert after["verdict"] == "fail" and after["regression"] is True


def test_known_failure_by_environment_name(client: TestClient, db_session: Session, make_token) -> None:
    admin, submit = make_token("admin"), make_token("submit")
    client.post("/api/v1/known-failures", headers=admin,
                json={"signature": BUG_A, "environments": ["default"], "link": ISSUE})
    env = Environment(name="other-build", python="python", packages={})
    db_session.add(env)
    db_session.flush()
    here = _run(client, db_session, submit, "fail", mcore="9.9")
    assert here["verdict"] == "known-failure"


def test_metrics_expose_open_regressions_and_queue_age(client: TestClient, db_session: Session, make_token) -> None:
    submit = make_token("submit")
    _run(client, db_session, submit, "pass")
    bad = _run(client, db_session, submit, "fail")
    client.post("/api/v1/runs", json={"spec": SPEC}, headers=submit)  # stays queued
    text = client.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("parity_open_regressions{"))
    assert f'check="{bad["check_key"]}"' in line and 'track="main"' in line and 'state="open"' in line
    assert line.endswith(" 1.0")
    age = next(ln for ln in text.splitlines() if ln.startswith("parity_oldest_queued_run_age_seconds "))
    assert float(age.split()[1]) >= 0.0
