"""One CheckSpec: the API's spec model is the engine's RunSpec field for field, /openapi.json states each
field's bounds and allowed values, a POST parses the spec once, and a bad spec still names its field."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest
from fastapi.testclient import TestClient

from jobs.configs import config_names
from jobs.spec import MAX_DP, MAX_STEPS, SHARDING_TYPES, WORKAROUNDS, RunSpec, field_default
from service.core.check_spec import CheckSpec

GOOD_SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}


def test_the_model_is_the_engine_spec_field_for_field() -> None:
    plain = {f.name: field_default(f) for f in fields(RunSpec)}
    engine = {k: (list(v) if isinstance(v, tuple) else None if v is MISSING else v) for k, v in plain.items()}
    model = {name: None if f.is_required() else f.get_default(call_default_factory=True)
             for name, f in CheckSpec.model_fields.items()}
    assert model == engine and list(model) == list(engine)
    assert [n for n, f in CheckSpec.model_fields.items() if f.is_required()] == [
        n for n, v in plain.items() if v is MISSING]
    assert CheckSpec.model_validate(GOOD_SPEC).run_spec == RunSpec.from_dict(GOOD_SPEC)


def test_openapi_states_each_field_with_its_constraints(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    body = doc["components"]["schemas"]["RunCreate"]["properties"]["spec"]
    assert body["$ref"].endswith("/CheckSpec") or any(r.get("$ref", "").endswith("/CheckSpec")
                                                      for r in body.get("allOf", []))
    spec = doc["components"]["schemas"]["CheckSpec"]
    assert spec["required"] == ["config", "dp", "steps", "save_step"]
    assert spec["additionalProperties"] is False
    props = spec["properties"]
    assert props["config"]["enum"] == config_names()
    assert (props["dp"]["minimum"], props["dp"]["maximum"]) == (1, MAX_DP)
    assert (props["steps"]["minimum"], props["steps"]["maximum"]) == (2, MAX_STEPS)
    assert props["sharding"]["enum"] == list(SHARDING_TYPES)
    assert props["workarounds"]["items"]["enum"] == list(WORKAROUNDS)
    assert props["async_save"]["type"] == "boolean"


def test_a_post_parses_the_spec_once(client: TestClient, make_token, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    original = RunSpec.__post_init__

    def counted(self: RunSpec) -> None:
        built.append(self.config)
        original(self)

    monkeypatch.setattr(RunSpec, "__post_init__", counted)
    resp = client.post("/api/v1/runs", json={"spec": GOOD_SPEC}, headers=make_token("submit"))
    assert resp.status_code == 202, resp.text
    assert built == ["moe-fp32-router"]
    assert resp.json()["check_key"] and resp.json()["check_name"].startswith("moe-fp32-router dp=2")


@pytest.mark.parametrize(("change", "field", "allowed"), [
    ({"sharding": "zigzag"}, "spec.sharding", "fully_reshardable"),
    ({"dp": 99}, "spec.dp", "1, 2"),
    ({"workarounds": ["no-such"]}, "spec.workarounds", WORKAROUNDS[0]),
    ({"async_save": "yes"}, "spec.async_save", "False, True"),
    ({"colour": "red"}, "spec", "save_step"),
])
def test_a_bad_spec_names_the_field_and_the_allowed_values(client: TestClient, make_token, change: dict,
                                                           field: str, allowed: str) -> None:
    resp = client.post("/api/v1/runs", json={"spec": {**GOOD_SPEC, **change}}, headers=make_token("submit"))
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "invalid_spec" and resp.json()["field"] == field
    assert "allowed: " in resp.json()["detail"] and allowed in resp.json()["detail"]


def test_a_spec_that_is_not_an_object_names_spec(client: TestClient, make_token) -> None:
    resp = client.post("/api/v1/runs", json={"spec": ["config"]}, headers=make_token("submit"))
    assert resp.status_code == 422 and resp.json()["field"] == "spec"
