"""Custom shapes: every field accepted in range and refused outside it, naming `shape.<field>`; rules up front."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.configs import get_config
from jobs.shape import MAX_PARAMS, SHAPE_FIELDS, apply_shape, estimated_params
from jobs.spec import RunSpec, SpecError, allowed_values
from service.cli.client.shape_arg import parse_shape, shape_help
from service.core.checks import check_key, check_name

MOE = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}
DENSE = {**MOE, "config": "dense-bf16"}
# a value inside the range of every field (that keeps the other rules) and one just outside it
ACCEPTED: dict[str, list[Any]] = {
    "num_layers": [1, 4], "hidden_size": [16, 64, 256], "num_attention_heads": [1, 2, 8],
    "num_experts": [2, 16], "moe_router_topk": [1, 2], "ffn_hidden_size": [16, 1024],
    "seq_length": [8, 128], "vocab_size": [64, 4096],
    "fp32_router": [False, True], "fp32_gates": [False, True], "fp32_output_head": [False, True],
}
REJECTED: dict[str, list[Any]] = {
    "num_layers": [0, 5, "2", 2.0, True], "hidden_size": [8, 512, None], "num_attention_heads": [0, 9],
    "num_experts": [1, 17], "moe_router_topk": [0, 5], "ffn_hidden_size": [15, 1025],
    "seq_length": [7, 129], "vocab_size": [63, 4097],
    "fp32_router": [1, "yes"], "fp32_gates": [0, None], "fp32_output_head": ["true"],
}


def test_every_field_is_covered() -> None:
    assert set(ACCEPTED) == set(REJECTED) == set(SHAPE_FIELDS)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in ACCEPTED.items() for v in vs])
def test_in_range_values_are_accepted_and_stored(name: str, value: Any) -> None:
    shape = {name: value}
    if name == "moe_router_topk":
        shape["num_experts"] = 4
    spec = RunSpec.from_dict({**MOE, "shape": shape})
    assert spec.to_dict()["shape"] == dict(sorted(shape.items()))
    assert RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in REJECTED.items() for v in vs])
def test_out_of_range_values_name_the_field_and_range(name: str, value: Any) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**MOE, "shape": {name: value}})
    err = info.value
    assert err.field == f"shape.{name}" and str(err).startswith(f"shape.{name}: ")
    f = SHAPE_FIELDS[name]
    if f.kind == "int":
        assert f"{f.lo}..{f.hi}" in str(err)
    else:
        assert err.allowed == [False, True]


@pytest.mark.parametrize(
    ("base", "shape", "field", "text"),
    [
        (MOE, {"colour": 1}, "shape", "unknown key(s) colour; allowed: num_layers, hidden_size"),
        (MOE, {"hidden_size": 100}, "shape.hidden_size", "divisible by num_attention_heads 4"),
        (MOE, {"num_attention_heads": 8, "hidden_size": 24}, "shape.hidden_size", "even head dim"),
        (MOE, {"num_attention_heads": 3}, "shape.num_attention_heads", "divisible"),
        (MOE, {"num_experts": 2, "moe_router_topk": 3}, "shape.moe_router_topk", "exceeds num_experts 2"),
        (MOE, {"num_experts": 2, "moe_router_topk": 4}, "shape.moe_router_topk", "allowed: 1, 2"),
        (DENSE, {"num_experts": 4}, "shape.num_experts", "only for configs with experts; 'dense-bf16' is dense"),
        (DENSE, {"moe_router_topk": 1}, "shape.moe_router_topk", "only for configs with experts"),
        (DENSE, {"fp32_router": True}, "shape.fp32_router", "only for configs with experts"),
        ({**MOE, "config": "equal-shards-fp32-head"}, {"hidden_size": 64}, "shape", "takes no shape overrides"),
        (MOE, {"num_layers": 4, "num_experts": 16, "hidden_size": 256, "ffn_hidden_size": 512}, "shape",
         f"a check stays under {MAX_PARAMS:,}"),
        (MOE, [1], "shape", "must be an object"),
    ],
)
def test_cross_field_rules_are_checked_up_front(base: dict, shape: Any, field: str, text: str) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**base, "shape": shape})
    assert info.value.field == field and text in str(info.value)


def test_an_empty_shape_is_the_preset_and_leaves_stored_specs_unchanged() -> None:
    plain = RunSpec.from_dict(MOE)
    assert "shape" not in plain.to_dict() and RunSpec.from_dict({**MOE, "shape": {}}) == plain
    assert apply_shape(get_config("moe-fp32-router"), {}) is get_config("moe-fp32-router")
    shaped = RunSpec.from_dict({**MOE, "shape": {"num_layers": 3}})
    assert check_key(shaped.to_dict()) != check_key(plain.to_dict())
    assert check_name(shaped.to_dict()).endswith("shape=num_layers:3")


def test_apply_shape_sets_the_fp32_toggles_and_ffn_size() -> None:
    preset = get_config("moe-fp32-router")
    cfg = apply_shape(preset, {"fp32_router": False, "fp32_output_head": True, "fp32_gates": True,
                               "ffn_hidden_size": 96, "num_experts": 8})
    assert cfg.fp32_modules == ("output_layer",) and cfg.fp32_residual_gates
    assert (cfg.ffn_hidden_size, cfg.num_experts, cfg.name) == (96, 8, preset.name)
    assert apply_shape(preset, {"hidden_size": 64}).fp32_modules == ("mlp.router",)
    assert estimated_params(preset) < 1_000_000  # the preset's own "~0.9M params"


def test_cli_parses_key_values_and_json_and_documents_every_field() -> None:
    assert parse_shape(["num_layers=3", "fp32_output_head=true", '{"hidden_size": 64}']) == {
        "num_layers": 3, "fp32_output_head": True, "hidden_size": 64}
    with pytest.raises(SystemExit, match="key=value"):
        parse_shape(["num_layers"])
    text = shape_help()
    for name, f in SHAPE_FIELDS.items():
        assert (f"{name} {f.lo}..{f.hi}" if f.kind == "int" else f"{name} true|false") in text
    assert set(allowed_values()["shape"]) == set(SHAPE_FIELDS)
