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


# --- resume under another DP layout (resume_dp) ---


def test_resume_dp_is_absent_unless_set_and_keeps_the_check_identity() -> None:
    plain = RunSpec.from_dict(GOOD)
    assert "resume_dp" not in plain.to_dict() and not plain.reshards
    assert plain.phase_dp("resume") == 2 and plain.microbatches("resume") == 1
    assert (plain.effective_isolation, plain.effective_tolerance) == ("process", "exact")
    spec = RunSpec.from_dict({**GOOD, "resume_dp": 1})
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["resume_dp"] == 1 and RunSpec.from_dict(data) == spec and spec != plain
    assert (spec.phase_dp("train_and_save"), spec.phase_dp("resume")) == (2, 1)
    # the global batch stays 2 microbatches: rank 0 of the resume accumulates both
    assert spec.global_microbatches == 2
    assert (spec.microbatches("train_and_save"), spec.microbatches("resume")) == (1, 2)


def test_resume_dp_switches_isolation_and_tolerance_unless_chosen() -> None:
    spec = RunSpec.from_dict({**GOOD, "resume_dp": 1})
    assert (spec.effective_isolation, spec.effective_tolerance) == ("job", "reshard")
    loose = RunSpec.from_dict({**GOOD, "resume_dp": 1, "tolerance": "loose", "isolation": "job"})
    assert (loose.effective_isolation, loose.effective_tolerance) == ("job", "loose")


def test_resume_dp_uneven_sizes_share_the_lcm_batch() -> None:
    spec = RunSpec.from_dict({**GOOD, "dp": 2, "resume_dp": 3})
    assert spec.global_microbatches == 6
    assert (spec.microbatches("train_and_save"), spec.microbatches("resume")) == (3, 2)


@pytest.mark.parametrize(
    ("change", "message", "allowed_has"),
    [
        ({"resume_dp": 0}, "out of range", None),
        ({"resume_dp": MAX_DP + 1}, "exceeds the maximum", MAX_DP),
        ({"resume_dp": "1"}, "must be an integer", None),
        ({"resume_dp": True}, "must be an integer", None),
        ({"resume_dp": 2}, "equals dp (2); omit it", None),
        ({"config": "equal-shards-fp32-head", "resume_dp": 4}, "exceeds the maximum 2", 2),
        ({"dp": 7, "resume_dp": 8}, "8 per rank at DP 7), more than 4", None),
        ({"config": "dense-bf16-dropout", "resume_dp": 1}, "uses dropout", "dense-bf16"),
        ({"dp": 4, "nodes": 2, "resume_dp": 1}, "not divisible by nodes (2)", 2),
    ],
)
def test_bad_resume_dp_is_refused_naming_the_field(change: dict, message: str, allowed_has: object) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**GOOD, **change})
    assert info.value.field == "resume_dp" and message in str(info.value), str(info.value)
    if allowed_has is not None:
        assert info.value.allowed is not None and allowed_has in info.value.allowed


def test_stored_spec_helpers_read_resume_dp() -> None:
    from jobs.spec import phase_tasks, spec_isolation

    stored = RunSpec.from_dict({**GOOD, "resume_dp": 1}).to_dict()
    assert (phase_tasks(stored, "train_and_save"), phase_tasks(stored, "resume")) == (2, 1)
    assert spec_isolation(stored) == "job"
    plain = RunSpec.from_dict(GOOD).to_dict()
    assert phase_tasks(plain, "resume") == 2 and spec_isolation(plain) == "process"
    assert spec_isolation({"config": "dense-bf16", "dp": 1}) == "job"  # stored before isolation existed
    assert allowed_values()["resume_dp"]["max"] == MAX_DP
