"""Another client's runs, suite runs, sweeps and bisects: reserved labels refused, ownership by token id, GETs
that never write."""

from __future__ import annotations

import sys

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Bisect, Run
from service.bisects import search as bisects
from service.core.run_state import RunState
from service.core.settings import get_settings
from service.environments.registry import create_environment
from service.runs.lifecycle import transition

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3}


@pytest.mark.parametrize("labels", [
    {"bisect": "0123456789ab"}, {"sweep": "0123456789ab", "variation": "base"}, {"variation": "base"},
    {"mutant": "x"}, {"selftest": "detector-health"}, {"selftest_batch": "2026"},
    # a run tagged with another tenant's suite run would list itself under it and silence its own alert
    {"suite_run": "0123456789ab"}, {"suite": "gate"}, {"suite_check": "tp2-dense-bf16"},
])
def test_reserved_labels_are_refused_on_runs_suite_runs_sweeps_and_bisects(
    client: TestClient, make_token, db_session: Session, labels: dict[str, str]
) -> None:
    submit = make_token("submit")
    resp = client.post("/api/v1/runs", headers=submit, json={"spec": SPEC, "labels": labels})
    assert resp.status_code == 422 and resp.json()["field"] == "labels", resp.text
    assert "reserved for the service" in resp.json()["detail"]
    sweep = client.post("/api/v1/sweeps", headers=submit, json={"configs": ["dense-bf16"], "base": SPEC,
                                                                 "labels": labels})
    assert sweep.status_code == 422 and sweep.json()["field"] == "labels", sweep.text
    bisect = client.post("/api/v1/bisects", headers=submit, json={"spec": SPEC, "good": "a", "bad": "b",
                                                                   "labels": labels})
    assert bisect.status_code == 422 and bisect.json()["field"] == "labels", bisect.text
    suite_run = client.post("/api/v1/suite-runs", headers=submit, json={"suite": "gate", "labels": labels})
    assert suite_run.status_code == 422 and suite_run.json()["field"] == "labels", suite_run.text
    assert db_session.scalar(select(func.count()).select_from(Run)) == 0


def test_ownership_is_by_token_id_not_by_name(client: TestClient, make_token) -> None:
    mine, namesake, admin = make_token("submit", name="ci"), make_token("submit", name="ci"), make_token("admin")
    run = client.post("/api/v1/runs", headers=mine, json={"spec": SPEC}).json()
    for action in ("cancel", "rerun"):
        resp = client.post(f"/api/v1/runs/{run['id']}/{action}", headers=namesake)
        assert resp.status_code == 403, f"another token called 'ci' could {action}: {resp.text}"
    assert client.post(f"/api/v1/runs/{run['id']}/rerun", headers=mine).status_code == 202
    assert client.post(f"/api/v1/runs/{run['id']}/cancel", headers=mine).status_code == 200
    assert client.post(f"/api/v1/runs/{run['id']}/rerun", headers=admin).status_code == 202


def test_get_bisect_never_writes(client: TestClient, make_token, db_session: Session) -> None:
    for name in ("env-a", "env-b", "env-c"):
        create_environment(db_session, name=name, python=sys.executable)
    doc = client.post("/api/v1/bisects", headers=make_token("submit"),
                      json={"spec": SPEC, "good": "env-a", "bad": "env-c", "between": ["env-b"]}).json()
    (run,) = db_session.scalars(select(Run).where(Run.labels.contains({"bisect": doc["id"]})))
    transition(db_session, run, RunState.ERROR, "test")
    row = db_session.get(Bisect, doc["id"])
    assert row is not None
    before = (row.state, row.updated_at, db_session.scalar(select(func.count()).select_from(Run)))
    for _ in range(3):
        got = client.get(f"/api/v1/bisects/{doc['id']}")
        assert got.status_code == 200 and got.json()["state"] == "running"
    db_session.refresh(row)
    assert (row.state, row.updated_at, db_session.scalar(select(func.count()).select_from(Run))) == before
    bisects.advance_open(db_session, settings=get_settings())  # the scheduler's pass is what moves it
    assert client.get(f"/api/v1/bisects/{doc['id']}").json()["state"] == "error"
