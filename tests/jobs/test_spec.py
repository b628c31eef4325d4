"""RunSpec validation: every bad spec is refused with the field and allowed values named."""

from __future__ import annotations

import json

import pytest

from jobs.configs import list_configs
from jobs.spec import MAX_DP, WORKAROUNDS, RunSpec, SpecError, allowed_values

GOOD = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


def test_round_trip_is_plain_json() -> None:
    spec = RunSpec.from_dict({**GOOD, "workarounds": ["restore-adam-step", "realign-param-index"]})
    data = json.loads(json.dumps(spec.to_dict()))
    assert RunSpec.from_dict(data) == spec
    assert data["workarounds"] == ["realign-param-index", "restore-adam-step"]
    assert spec.resumed_steps == [4, 5, 6]


@pytest.mark.parametrize(
    ("change", "field", "allowed_has"),
    [
        ({"save_step": 6}, "save_step", None),
        ({"save_step": 9}, "save_step", None),
        ({"save_step": 0}, "save_step", None),
        ({"config": "x"}, "config", "moe-fp32-router"),
        ({"dp": MAX_DP + 1}, "dp", MAX_DP),
        ({"config": "equal-shards-fp32-head", "dp": 4}, "dp", 2),
        ({"dp": 0}, "dp", None),
        ({"dp": True}, "dp", None),
        ({"workarounds": ["make-it-pass"]}, "workarounds", "realign-param-index"),
        ({"workarounds": "restore-adam-step"}, "workarounds", "restore-adam-step"),
        ({"sharding": "zip"}, "sharding", "dp_reshardable"),
        ({"tolerance": "vibes"}, "tolerance", "exact"),
        ({"seed": -1}, "seed", None),
    ],
)
def test_bad_values_name_field_and_allowed(change: dict, field: str, allowed_has: object) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**GOOD, **change})
    err = info.value
    assert err.field == field
    assert str(err).startswith(f"{field}: ")
    if allowed_has is not None:
        assert err.allowed is not None and allowed_has in err.allowed
        assert "allowed: " in str(err)


def test_unknown_config_message() -> None:
    with pytest.raises(SpecError, match=r"^config: unknown config 'x'; allowed: dense-bf16, "):
        RunSpec.from_dict({**GOOD, "config": "x"})


def test_unknown_and_missing_keys() -> None:
    with pytest.raises(SpecError, match="unknown key.*colour") as info:
        RunSpec.from_dict({**GOOD, "colour": "red"})
    assert info.value.field == "spec" and "save_step" in (info.value.allowed or [])
    with pytest.raises(SpecError) as missing:
        RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "steps": 4})
    assert missing.value.field == "save_step"


def test_allowed_values_and_configs_are_plain_data() -> None:
    values = allowed_values()
    assert values["workarounds"] == list(WORKAROUNDS)
    configs = list_configs()
    json.dumps(configs)
    names = {c["name"] for c in configs}
    assert {"moe-fp32-router", "moe-fp32-router-gates", "dense-bf16", "equal-shards-fp32-head"} <= names
    assert all(c["description"] and c["why"] and c["parameters"] for c in configs)



def test_mutants_are_validated_and_absent_from_ordinary_specs() -> None:
    from jobs.selftest.catalogue import MUTANTS, health_specs

    base = {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}
    assert "mutants" not in RunSpec.from_dict(base).to_dict()
    spec = RunSpec.from_dict({**base, "mutants": ["rng-tracker-not-restored", "exp-avg-sq-reset"]})
    assert spec.to_dict()["mutants"] == ["exp-avg-sq-reset", "rng-tracker-not-restored"]
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**base, "mutants": ["nope"]})
    assert err.value.field == "mutants" and "rng-tracker-not-restored" in str(err.value)
    assert len([m for m in MUTANTS.values() if not m.benign]) >= 10
    for _, fields in health_specs():
        RunSpec.from_dict(fields)
    for mutant in MUTANTS.values():
        RunSpec.from_dict(mutant.run_spec(2))


def test_every_catalogue_mutant_has_an_injection() -> None:
    from jobs.rank.mutants import REGISTRY
    from jobs.selftest.catalogue import MUTANTS

    assert set(REGISTRY) == set(MUTANTS)


def test_steps_must_exceed_the_configs_lr_warmup() -> None:
    # Megatron's scheduler asserts warmup < decay steps: a 3-step run of a 3-step-warmup config must
    # be a 422 naming steps, not a crash inside the job
    with pytest.raises(SpecError, match=r"steps: 3 must exceed .*3 LR warmup steps; allowed: 4\.\.") as exc:
        RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "steps": 3, "save_step": 2})
    assert exc.value.field == "steps"
    assert RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}).steps == 4
