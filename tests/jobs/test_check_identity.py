"""Check identity as a rule (jobs/spec.py ALWAYS_STORED): adding a spec field at its default re-keys
no check; the same field at another value makes another check; and a config whose training changes
(jobs/configs.py TRAINING_REVISION, a field, a default) makes another check of the same spec. The keys
below are those of training revision 2 (the production recipe by default): the identities a deployed
database stores from then on (revision 1's toy-trained runs keep theirs, a history of their own)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jobs.spec import ALWAYS_STORED, RunSpec
from service.core.checks import check_key, check_name

MOE = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}
KNOWN_KEYS: list[tuple[dict[str, Any], str]] = [
    (MOE, "6181c90813ef1262"),
    ({**MOE, "workarounds": ["realign-param-index", "restore-adam-step"]}, "c427b632970fc9e0"),
    ({"config": "dense-bf16", "dp": 2, "steps": 8, "save_step": 4, "isolation": "job",
      "sharding": "fully_reshardable"}, "4698400095f0bb6d"),
    ({**MOE, "resume_dp": 1}, "6bdf89fc6e6344b7"),
    ({**MOE, "ep": 2}, "1409e637de8e8b2d"),
    ({**MOE, "nodes": 2}, "115235fececcab51"),
    ({"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3, "mutants": ["exp-avg-sq-reset"]},
     "ed8b83d74a54c5bf"),
    ({**MOE, "shape": {"num_layers": 1}}, "b2ea23525b5e30fd"),
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


def test_a_config_whose_training_changes_is_another_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same spec on a config trained another way (here: one microbatch, no overlapped buckets) is
    another check, so no history compares a recipe-shaped run with a toy one."""
    from jobs import configs

    before = check_key(MOE), check_name(MOE)
    toy = dataclasses.replace(configs.CONFIGS["moe-fp32-router"], microbatches=1, bucket_size=0)
    monkeypatch.setitem(configs.CONFIGS, "moe-fp32-router", toy)
    assert check_key(MOE) != before[0]
    assert check_name(MOE) == before[1]  # the readable name is the spec's: the same words, another history
    assert RunSpec.from_dict(MOE).training.startswith(f"r{configs.TRAINING_REVISION}-")
