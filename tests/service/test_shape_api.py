"""Custom shapes over the API: GET /api/v1/configs documents every field with its range; POST /runs validates."""

from __future__ import annotations

import argparse

from fastapi.testclient import TestClient

from jobs.shape import SHAPE_FIELDS
from service.cli.client.submit import build_body

RUN = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


def test_configs_document_every_shape_field_with_its_range(client: TestClient) -> None:
    configs = {c["name"]: c for c in client.get("/api/v1/configs").json()}
    moe = configs["moe-fp32-router"]["shape_fields"]
    assert list(moe) == list(SHAPE_FIELDS)
    for name, f in SHAPE_FIELDS.items():
        doc = moe[name]
        assert doc["type"] == f.kind and doc["description"]
        if f.kind == "int":
            assert (doc["min"], doc["max"]) == (f.lo, f.hi)
        else:
            assert doc["allowed"] == [False, True]
    # each preset's own values, so a client sees what it overrides
    assert (moe["num_experts"]["preset"], moe["moe_router_topk"]["preset"], moe["hidden_size"]["preset"]) == (4, 2, 128)
    assert moe["ffn_hidden_size"]["preset"] == 256 and moe["fp32_router"]["preset"] is True
    assert moe["fp32_output_head"]["preset"] is False and moe["num_experts"]["only_for"]
    assert configs["moe-fp32-router-gates"]["shape_fields"]["fp32_gates"]["preset"] is True
    dense = configs["dense-bf16"]["shape_fields"]
    assert set(dense) == {n for n, f in SHAPE_FIELDS.items() if not f.moe_only}
    assert configs["equal-shards-fp32-head"]["shape_fields"] == {}


def test_runs_take_a_shape_and_refuse_a_bad_one(client: TestClient, make_token) -> None:
    headers = make_token("submit")
    bad = client.post("/api/v1/runs", headers=headers,
                      json={"spec": {**RUN, "shape": {"hidden_size": 300}}})
    assert bad.status_code == 422 and bad.json()["field"] == "spec.shape.hidden_size"
    assert "out of range 16..256" in bad.json()["detail"]
    unknown = client.post("/api/v1/runs", headers=headers, json={"spec": {**RUN, "shape": {"layers": 3}}})
    assert unknown.status_code == 422 and unknown.json()["field"] == "spec.shape"
    assert "allowed: num_layers" in unknown.json()["detail"]
    shape = {"num_layers": 3, "num_experts": 8, "moe_router_topk": 1, "hidden_size": 64}
    ok = client.post("/api/v1/runs", headers=headers, json={"spec": {**RUN, "shape": shape}})
    assert ok.status_code == 202, ok.text
    assert ok.json()["spec"]["shape"] == dict(sorted(shape.items()))
    assert "shape=hidden_size:64,moe_router_topk:1,num_experts:8,num_layers:3" in ok.json()["check_name"]
    plain = client.post("/api/v1/runs", headers=headers, json={"spec": RUN}).json()
    assert "shape" not in plain["spec"] and plain["check_key"] != ok.json()["check_key"]


def test_submit_sends_the_shape() -> None:
    args = argparse.Namespace(config="moe-fp32-router", dp=2, steps=6, save_step=3, sharding=None, seed=None,
                              tolerance=None, isolation=None, workaround=[], label=[], environment="default",
                              shape=["num_layers=3", "fp32_output_head=true"])
    assert build_body(args)["spec"]["shape"] == {"num_layers": 3, "fp32_output_head": True}
