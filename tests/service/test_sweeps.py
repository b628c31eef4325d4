"""Sweeps: one call queues configs × environments × variations; the grid (API and page) shows each cell."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Run
from service.cli.client.sweep import grid_table
from service.core.run_state import RunState
from service.runs.lifecycle import transition


@pytest.mark.engine
def test_a_sweep_queues_every_cell_and_its_grid_fills_in(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit")
    built = client.post("/api/v1/environments", json={"requirements": ["megatron-core==0.15.3"]}, headers=headers)
    body = {
        "configs": ["moe-fp32-router", "dense-bf16"],
        "environments": ["default", built.json()["name"]],
        "variations": [{}, {"sharding": "fully_sharded_model_space"}],
        "base": {"dp": 2, "steps": 6, "save_step": 3},
        "labels": {"branch": "main"},
    }
    resp = client.post("/api/v1/sweeps", json=body, headers=headers)
    assert resp.status_code == 202, resp.text
    grid = resp.json()
    assert grid["runs"] == 8 and grid["finished"] == 0
    assert grid["configs"] == ["moe-fp32-router", "dense-bf16"]
    assert [(r["environment"], r["variation"]) for r in grid["rows"]] == [
        ("default", "base"), ("default", "sharding=fully_sharded_model_space"),
        (built.json()["name"], "base"), (built.json()["name"], "sharding=fully_sharded_model_space"),
    ]
    runs = db_session.scalars(select(Run).where(Run.labels.contains({"sweep": grid["id"]})).order_by(Run.id)).all()
    assert len(runs) == 8 and all(r.labels["branch"] == "main" for r in runs)
    assert {r.spec["sharding"] for r in runs} == {"dp_reshardable", "fully_sharded_model_space"}

    # one run finishes: its cell shows the verdict, the page and the table show it too
    first = runs[0]
    for state in (RunState.TRAIN_SUBMITTED, RunState.ERROR):
        transition(db_session, first, state, "test")
    first.verdict, first.signatures = "error", ["unsupported-by-build"]
    db_session.flush()
    grid = client.get(f"/api/v1/sweeps/{grid['id']}").json()
    assert grid["finished"] == 1
    cell = grid["rows"][0]["cells"]["moe-fp32-router"]
    assert cell["verdict"] == "error" and cell["signatures"] == ["unsupported-by-build"]
    assert "error: unsupported-by-build" in grid_table(grid)
    page = client.get(f"/sweeps/{grid['id']}")
    assert page.status_code == 200 and "unsupported-by-build" in page.text and "1 of 8 runs finished" in page.text


def test_a_bad_cell_queues_nothing(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit")
    before = len(db_session.scalars(select(Run)).all())
    resp = client.post("/api/v1/sweeps", headers=headers, json={
        "configs": ["moe-fp32-router", "equal-shards-fp32-head"], "variations": [{"dp": 4}]})
    assert resp.status_code == 422 and resp.json()["field"] == "spec.dp"
    assert "equal-shards-fp32-head" in resp.json()["detail"]
    unknown = client.post("/api/v1/sweeps", headers=headers, json={"configs": ["dense-bf16"], "environments": ["x"]})
    assert unknown.status_code == 404 and unknown.json()["field"] == "environment"
    assert len(db_session.scalars(select(Run)).all()) == before
    assert client.get("/api/v1/sweeps/0123456789ab").status_code == 404


def test_release_table_orders_versions_and_names_what_a_build_lacks() -> None:
    from service.cli.client.sweep import release_table

    def cell(verdict: str, signatures: list[str], message: str | None = None) -> dict:
        return {"run_id": 1, "state": "failed", "verdict": verdict, "signatures": signatures, "error_message": message}

    grid = {"configs": ["moe-fp32-router"], "rows": [
        {"environment": "b", "megatron_core": "0.16.1", "variation": "base",
         "cells": {"moe-fp32-router": cell("fail", ["checkpoint-save-crash", "optimizer-index-misalignment"])}},
        {"environment": "a", "megatron_core": "0.9.0", "variation": "base",
         "cells": {"moe-fp32-router": cell("error", ["unsupported-by-build"],
                                           "UnsupportedByBuild: sharding 'dp_reshardable' is not supported by this "
                                           "build (megatron-core 0.9.0): it offers only fully_sharded_model_space")}},
    ]}
    lines = release_table(grid).splitlines()
    assert lines[0] == "| megatron-core | moe-fp32-router |"
    # 0.9.0 before 0.16.1: versions compare as numbers, not strings
    assert lines[2] == ("| 0.9.0 | unsupported: sharding 'dp_reshardable' "
                        "(it offers only fully_sharded_model_space) |")
    assert lines[3] == "| 0.16.1 | **fail**: checkpoint-save-crash, optimizer-index-misalignment |"
