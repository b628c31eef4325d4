"""Bisect (fast): the walk, reuse of stored verdicts, idempotent steps, the answer with links, bad input."""

from __future__ import annotations

import sys

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Run
from service.bisects import search as bisects
from service.cli.client.bisect import report
from service.core.check_spec import run_spec_of
from service.core.run_state import RunState
from service.core.settings import get_settings
from service.environments.registry import create_environment, get_environment
from service.runs.lifecycle import transition
from service.runs.records import create_run

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3, "workarounds": ["restore-adam-step"]}
ENVS = [f"build-{i}" for i in range(6)]


def _register(session: Session) -> None:
    for name in ENVS:
        create_environment(session, name=name, python=sys.executable)


def _finish(session: Session, run: Run, verdict: str) -> None:
    for state in (RunState.TRAIN_SUBMITTED, RunState.EVALUATING,
                  RunState.PASSED if verdict == "pass" else RunState.FAILED):
        transition(session, run, state, "test")
    run.verdict = verdict
    session.flush()


def _env(session: Session, run: Run) -> str:
    return next(n for n in ENVS if get_environment(session, name=n).id == run.environment_id)


def _runs(session: Session, bisect_id: str) -> list[Run]:
    return list(session.scalars(select(Run).where(Run.labels.contains({"bisect": bisect_id})).order_by(Run.id)))


def test_bisect_walks_to_the_first_bad_build_reusing_a_stored_verdict(
    client: TestClient, make_token, db_session: Session,
) -> None:
    headers = make_token("submit")
    _register(db_session)
    # build-3 already has a verdict of this check (another track, another requester): it is reused
    build3 = get_environment(db_session, name="build-3")
    stored, _ = create_run(db_session, spec=run_spec_of(SPEC), environment=build3, labels={"branch": "release"},
                           requester="ci")
    _finish(db_session, stored, "pass")
    body = {"spec": SPEC, "good": "build-0", "bad": "build-5", "between": ENVS[1:5]}
    resp = client.post("/api/v1/bisects", json=body, headers=headers)
    assert resp.status_code == 202, resp.text
    doc = resp.json()
    assert doc["state"] == "running" and doc["runs_created"] == 1
    (first,) = _runs(db_session, doc["id"])
    assert _env(db_session, first) == "build-2" and first.state == "queued"  # the middle of 0..5
    # asking again (API, CLI loop, scheduler) while the run is in flight queues nothing more
    assert client.get(f"/api/v1/bisects/{doc['id']}").json()["runs_created"] == 1
    # waiting on its run is not progress (the scheduler ticks again at once after progress: it would spin)
    assert bisects.advance_open(db_session, settings=get_settings()) == 0
    assert len(_runs(db_session, doc["id"])) == 1

    _finish(db_session, first, "pass")  # 2 good -> 3 (stored pass, reused) -> 4 is tested next
    # a GET only reads: the scheduler's pass moves the bisect on
    assert client.get(f"/api/v1/bisects/{doc['id']}").json()["runs_created"] == 1
    assert len(_runs(db_session, doc["id"])) == 1
    assert bisects.advance_open(db_session, settings=get_settings()) == 1  # queued its next run
    doc = client.get(f"/api/v1/bisects/{doc['id']}").json()
    runs = _runs(db_session, doc["id"])
    assert [_env(db_session, r) for r in runs] == ["build-2", "build-4"]
    assert doc["state"] == "running" and doc["runs_reused"] == 1

    _finish(db_session, runs[1], "fail")
    assert bisects.advance_open(db_session, settings=get_settings()) == 1  # found
    doc = client.get(f"/api/v1/bisects/{doc['id']}").json()
    assert doc["state"] == "found" and doc["first_bad"] == "build-4" and doc["last_good"] == "build-3"
    assert (doc["runs_created"], doc["runs_reused"]) == (2, 1)
    assert [e["tested"] for e in doc["environments"]] == [False, False, True, True, True, False]
    assert doc["environments"][3]["run"]["run_id"] == stored.id and doc["environments"][3]["run"]["reused"]
    assert doc["links"]["first_bad_run"] == f"http://testserver/runs/{runs[1].id}"
    assert doc["links"]["last_good_run"] == f"http://testserver/runs/{stored.id}"
    assert doc["links"]["dashboard"].endswith(f"/bisects/{doc['id']}")
    text = report(doc)
    assert "first bad: build-4 http://testserver/runs/" in text and "(stored verdict reused)" in text
    page = client.get(f"/bisects/{doc['id']}")
    assert page.status_code == 200 and "First bad: <strong>build-4</strong>" in page.text
    assert f"/runs/{runs[1].id}" in page.text

    # the same question again, by check key: every step is a stored verdict now, no run is created
    again = client.post("/api/v1/bisects", headers=headers, json={
        "check": stored.check_key, "good": "build-0", "bad": "build-5", "between": ENVS[1:5]}).json()
    assert again["state"] == "found" and again["first_bad"] == "build-4" and again["runs_created"] == 0


def test_a_run_without_verdict_stops_the_bisect(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit")
    _register(db_session)
    doc = client.post("/api/v1/bisects", headers=headers,
                      json={"spec": SPEC, "good": "build-0", "bad": "build-2", "between": ["build-1"]}).json()
    (run,) = _runs(db_session, doc["id"])
    transition(db_session, run, RunState.ERROR, "test")
    bisects.advance_open(db_session, settings=get_settings())
    doc = client.get(f"/api/v1/bisects/{doc['id']}").json()
    assert doc["state"] == "error" and f"run {run.id} on build-1 ended error" in doc["error_message"]


def test_bad_bisects_are_refused_naming_the_field(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit")
    _register(db_session)
    base = {"spec": SPEC, "good": "build-0", "bad": "build-1"}
    cases = [
        ({**base, "bad": "nope"}, 404, "environment"),
        ({**base, "between": ["build-0"]}, 422, "between"),
        ({**base, "spec": {**SPEC, "dp": 0}}, 422, "spec.dp"),
        ({**base, "spec": {**SPEC, "shape": {"hidden_size": 7}}}, 422, "spec.shape.hidden_size"),
        ({**base, "check": "0123456789abcdef"}, 422, None),
        ({k: v for k, v in base.items() if k != "spec"} | {"check": "0123456789abcdef"}, 404, "check"),
    ]
    for body, status, field in cases:
        resp = client.post("/api/v1/bisects", json=body, headers=headers)
        assert resp.status_code == status, (body, resp.text)
        if field:
            assert resp.json()["field"] == field, resp.json()
    assert db_session.scalars(select(Run)).all() == []
    assert client.get("/api/v1/bisects/0123456789ab").status_code == 404
