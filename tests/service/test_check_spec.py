"""One spec definition: the API's model (CheckSpec) and the client's options are generated from the engine's
RunSpec and match it field for field (default, bounds, allowed values, help); a field without its
description is refused; /openapi.json states each field's bounds and allowed values, a POST parses the
spec once, and a bad spec still names its field."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import MISSING, fields

import pytest
from fastapi.testclient import TestClient

from jobs.configs import config_names
from jobs.spec import MAX_DP, MAX_STEPS, SHARDING_TYPES, WORKAROUNDS, RunSpec, field_default
from service.cli.client import submit
from service.cli.client.spec_args import add_spec_arguments, spec_of
from service.core.check_spec import CheckSpec, model_field

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
    schema = CheckSpec.model_json_schema()["properties"]
    for f in fields(RunSpec):
        about, prop = f.metadata, schema[f.name]
        prop = next((p for p in prop.get("anyOf", []) if p.get("type") != "null"), prop) | {
            k: v for k, v in prop.items() if k != "anyOf"}
        assert prop["description"] == about["help"], f.name
        for bound, key in (("ge", "minimum"), ("le", "maximum"), ("lt", "exclusiveMaximum")):
            assert prop.get(key) == about[bound], (f.name, bound)
        assert prop.get("enum") == (list(about["choices"]) if about["choices"] else None), f.name
        assert prop.get("items", {}).get("enum") == (list(about["each"]) if about["each"] else None), f.name


def _submit_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    submit.register(parser.add_subparsers())
    return parser


def test_the_client_options_are_the_engine_spec_field_for_field() -> None:
    parser = _submit_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["submit"]
    options = {a.dest: a for a in sub._actions}
    for f in fields(RunSpec):
        action = options[f.name]  # every field is an option, whatever it is called on the command line
        if f.metadata["hidden"]:
            assert action.help == argparse.SUPPRESS
        else:
            assert action.help is not None and action.help.startswith(f.metadata["help"]), f.name
        default = field_default(f)
        if default is MISSING:
            assert action.default == f.metadata["suggested"], f.name
        elif default not in ((), {}, None):
            # left off, nothing is sent: the service applies the default the help states
            assert action.default is None and (isinstance(default, bool) or f"default {default}" in action.help)
    # nothing given but the config: the suggested values, and RunSpec's defaults for the rest
    spec = spec_of(parser.parse_args(["submit", "--config", "moe-fp32-router"]))
    assert spec == {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}
    assert RunSpec.from_dict(spec).to_dict() == RunSpec.from_dict(GOOD_SPEC).to_dict()
    given = spec_of(parser.parse_args([
        "submit", "--config", "moe-fp32-router", "--dp", "4", "--steps", "8", "--save-step", "4", "--seed", "7",
        "--workaround", WORKAROUNDS[0], "--isolation", "job", "--nodes", "2", "--async-save",
        "--shape", "num_layers=3"]))
    assert given == {"config": "moe-fp32-router", "dp": 4, "steps": 8, "save_step": 4, "seed": 7,
                     "workarounds": [WORKAROUNDS[0]], "isolation": "job", "nodes": 2, "async_save": True,
                     "shape": {"num_layers": 3}}
    assert RunSpec.from_dict(given).to_dict()["shape"] == {"num_layers": 3}


def test_a_spec_field_without_its_description_is_refused_by_both() -> None:
    bare = dataclasses.make_dataclass("Grown", [("colour", str, dataclasses.field(default="red"))])
    with pytest.raises(TypeError, match="colour.*about"):
        model_field(fields(bare)[0], str)
    with pytest.raises(TypeError, match="about"):
        add_spec_arguments.__globals__["RunSpec"] = bare
        try:
            add_spec_arguments(argparse.ArgumentParser())
        finally:
            add_spec_arguments.__globals__["RunSpec"] = RunSpec


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
