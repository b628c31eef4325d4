"""Check identity as a rule (jobs/spec.py ALWAYS_STORED): adding a spec field at its default re-keys
no check; the same field at another value makes another check. The keys below were computed before
the rule was written down: they are the identities stored in every deployed database."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobs.spec import ALWAYS_STORED, RunSpec
from service.core.checks import check_key, check_name

MOE = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}
KNOWN_KEYS: list[tuple[dict[str, Any], str]] = [
    (MOE, "88bdb716c19fd66a"),
    ({**MOE, "workarounds": ["realign-param-index", "restore-adam-step"]}, "14612133cc812f5c"),
    ({"config": "dense-bf16", "dp": 2, "steps": 8, "save_step": 4, "isolation": "job",
      "sharding": "fully_reshardable"}, "0b9fc00063cf149b"),
    ({**MOE, "resume_dp": 1}, "d22a3915894bc77b"),
    ({**MOE, "ep": 2}, "f9d7f8cd6a4a7ae6"),
    ({**MOE, "nodes": 2}, "f9436993da3ed8c2"),
    ({"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3, "mutants": ["exp-avg-sq-reset"]},
     "1a6bc0a98851467b"),
    ({**MOE, "shape": {"num_layers": 1}}, "a0dad812ed3070d1"),
]


@pytest.mark.parametrize(("spec", "key"), KNOWN_KEYS)
def test_existing_check_keys_are_unchanged(spec: dict[str, Any], key: str) -> None:
    assert check_key(spec) == key


def _with_new_field(default: Any) -> type[RunSpec]:
    """RunSpec as it would be with one more field, added the way the rule says."""
    return dataclasses.make_dataclass(
        "GrownSpec", [("future_knob", type(default), dataclasses.field(default=default))], bases=(RunSpec,), frozen=True
    )


@pytest.mark.parametrize(("spec", "key"), KNOWN_KEYS)
def test_a_field_added_at_its_default_rekeys_no_check(spec: dict[str, Any], key: str) -> None:
    grown = _with_new_field(0).from_dict(spec)
    assert "future_knob" not in grown.to_dict()
    assert grown.to_dict() == RunSpec.from_dict(spec).to_dict()


def test_the_same_field_at_another_value_is_another_check() -> None:
    grown = _with_new_field(0)
    base, changed = grown.from_dict(MOE).to_dict(), grown.from_dict({**MOE, "future_knob": 3}).to_dict()
    assert changed["future_knob"] == 3
    assert check_key(base) == KNOWN_KEYS[0][1]
    # check_key validates through RunSpec, which knows no future_knob: hash the stored forms as it would
    assert _hash(changed) != _hash(base)


def _hash(data: dict[str, Any]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def test_the_original_fields_are_always_stored_and_the_rest_only_when_set() -> None:
    stored = RunSpec.from_dict(MOE).to_dict()
    assert set(stored) == set(ALWAYS_STORED)
    full = RunSpec.from_dict({**MOE, "resume_dp": 1, "mutants": ["exp-avg-sq-reset"]}).to_dict()
    assert {"resume_dp", "mutants"} <= set(full)
    assert check_name({**MOE, "nodes": 2}).endswith("nodes=2")
