"""RunSpec validation: every bad spec is refused with the field and allowed values named."""

from __future__ import annotations

import json

import pytest

from jobs.config_listing import list_configs
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



def test_checkpoint_io_strategies_are_spec_variations() -> None:
    base = {"config": "moe-fp32-router", "dp": 2, "steps": 4, "save_step": 2}
    assert "async_save" not in RunSpec.from_dict(base).to_dict()  # stored specs and check keys unchanged
    spec = RunSpec.from_dict({**base, "async_save": True, "fully_parallel": True})
    assert spec.to_dict()["async_save"] is True and spec.to_dict()["fully_parallel"] is True
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**base, "async_save": "yes"})
    assert err.value.field == "async_save"
    assert allowed_values()["fully_parallel"] == [False, True]


RECIPE_SETTINGS = {
    "gated_linear_unit": True, "activation_func": "silu", "overlap_grad_reduce": True, "overlap_param_gather": True,
    "bucket_size": 20000, "num_microbatches": 2, "decoupled_lr": 0.002, "decoupled_min_lr": 0.0002,
    "lr_warmup_init": 0.0001, "scheduler_by_samples": True, "chained_optim_avoid_prefix": True,
    "singleton_local_shards": False,
}


def test_feature_configs_list_the_megatron_settings_they_switch_on() -> None:
    from jobs.configs import ModelConfig

    by_name = {c["name"]: c for c in list_configs()}
    aux = by_name["moe-aux-free"]["megatron"]
    assert aux["moe_router_enable_expert_bias"] is True and aux["moe_router_score_function"] == "sigmoid"
    assert aux["moe_router_load_balancing_type"] == "none"
    assert by_name["moe-shared-expert"]["megatron"]["moe_shared_expert_intermediate_size"] == 256
    fp16 = by_name["dense-fp16"]["megatron"]
    assert fp16["fp16"] is True and fp16["loss_scale"] is None and "bf16" not in fp16  # the dynamic scaler
    # every GPT config trains as a production recipe (jobs/configs.py): SwiGLU, tied embeddings, overlapped
    # buckets, 2 microbatches, a decoupled LR, warmup from a non-zero LR, the scheduler in samples, metadata
    tied = {"share_embeddings_and_output_weights": True}
    assert by_name["dense-bf16"]["megatron"] == {"bf16": True, **RECIPE_SETTINGS, **tied}
    assert "moe_router_enable_expert_bias" not in by_name["moe-fp32-router"]["megatron"]
    # features that need CUDA / Transformer Engine say so: GPU checks
    assert by_name["moe-grouped-gemm-te"]["requires"] == ["cuda", "transformer-engine"]
    assert by_name["moe-grouped-gemm-te"]["megatron"]["moe_grouped_gemm"] is True
    assert [n for n, c in by_name.items() if c["requires"]] == ["dense-fp8-te", "moe-grouped-gemm-te"]
    fp8 = by_name["dense-fp8-te"]
    assert fp8["requires"] == ["cuda", "transformer-engine"] and fp8["megatron"]["fp8"] == "hybrid"
    # the multi-token-prediction head: its settings, at the one layout the harness verifies
    mtp = by_name["gpt-mtp"]
    assert mtp["megatron"] == {"bf16": True, **RECIPE_SETTINGS, "mtp_num_layers": 1, "mtp_loss_scaling_factor": 0.1}
    # untied as DeepSeek-V3 trains it, so the head may sit on a last pipeline stage (tied: pp 1 only)
    assert mtp["requires"] == [] and mtp["layouts"] == {"tp": [1], "pp": [1, 2], "ep": [1]}
    assert by_name["gpt-mtp-fp32-proj"]["megatron"]["fp32_mtp_modules"] == ["eh_proj"]
    with pytest.raises(ValueError, match="MTP head"):
        ModelConfig(name="x", description="", why="", fp32_modules=("eh_proj",))
    for config, field in (("gpt-mtp", "tp"), ("gpt-mtp-fp32-proj", "pp")):  # refused by name, never run unproven
        with pytest.raises(SpecError, match="multi-token-prediction head") as err:
            RunSpec.from_dict({"config": config, "dp": 2, "steps": 4, "save_step": 2, field: 2})
        assert err.value.field == field
    with pytest.raises(ValueError, match="mtp_num_layers"):
        ModelConfig(name="x", description="", why="", mtp_num_layers=3)
    with pytest.raises(ValueError, match="mtp_num_layers"):
        ModelConfig(name="x", description="", why="", kind="linear-stack", mtp_num_layers=1)
    with pytest.raises(ValueError, match="fp8"):
        ModelConfig(name="x", description="", why="", fp8="hybrid")
    with pytest.raises(ValueError, match="sigmoid"):
        ModelConfig(name="x", description="", why="", num_experts=4, expert_bias=True)
    with pytest.raises(ValueError, match="MoE"):
        ModelConfig(name="x", description="", why="", shared_expert_size=64)


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


# --- parallel layout (tp / pp / ep beside dp) ---

MOE = {"config": "moe-fp32-router", "steps": 6, "save_step": 3}
DENSE = {"config": "dense-bf16", "steps": 6, "save_step": 3}


@pytest.mark.parametrize(
    ("fields", "world"),
    [
        ({**MOE, "dp": 2}, 2),
        ({**MOE, "dp": 2, "ep": 2}, 2),
        ({**MOE, "dp": 4, "ep": 4}, 4),
        ({**MOE, "dp": 4, "ep": 2}, 4),
        ({**MOE, "dp": 1, "tp": 2}, 2),
        ({**MOE, "dp": 2, "tp": 2}, 4),
        ({**MOE, "dp": 1, "tp": 4}, 4),
        ({**DENSE, "dp": 2, "tp": 2}, 4),
        ({**DENSE, "dp": 8}, 8),  # dp alone keeps its own limit
        ({**MOE, "dp": 2, "tp": 1, "pp": 1, "ep": 1}, 2),
        ({**MOE, "dp": 1, "pp": 2}, 2),
        ({**MOE, "dp": 2, "pp": 2}, 4),
    ],
)
def test_layouts_megatron_accepts(fields: dict, world: int) -> None:
    spec = RunSpec.from_dict(fields)
    assert spec.world_size == world == spec.dp * spec.tp * spec.pp
    assert RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize(
    ("change", "field", "allowed", "text"),
    [
        ({**MOE, "dp": 1, "tp": 3}, "tp", [1, 2, 4], "does not divide hidden_size 128"),
        ({**MOE, "dp": 1, "tp": 0}, "tp", [1, 2, 3, 4], "out of range 1..4"),
        ({**MOE, "dp": 1, "tp": 5}, "tp", [1, 2, 3, 4], "out of range 1..4"),
        ({**MOE, "dp": 1, "tp": "2"}, "tp", [1, 2, 3, 4], "must be an integer"),
        ({**MOE, "dp": 1, "tp": True}, "tp", [1, 2, 3, 4], "must be an integer"),
        ({**MOE, "dp": 4, "tp": 2}, "tp", [1], "world size dp * tp * pp = 4 * 2 * 1 = 8 exceeds 4"),
        ({**MOE, "dp": 2, "tp": 4}, "tp", [1, 2], "exceeds 4"),
        ({"config": "equal-shards-fp32-head", "dp": 1, "steps": 6, "save_step": 3, "tp": 2}, "tp", [1],
         "has no tensor-parallel layers"),
        ({**MOE, "dp": 1, "pp": 3}, "pp", [1, 2], "does not divide num_layers 2"),
        ({**MOE, "dp": 1, "pp": 4}, "pp", [1, 2], "does not divide num_layers 2"),
        ({**MOE, "dp": 4, "pp": 2}, "pp", [1], "world size dp * tp * pp = 4 * 1 * 2 = 8 exceeds 4"),
        ({**MOE, "dp": 2, "tp": 2, "pp": 2}, "pp", [1], "combining tp and pp > 1 is not yet supported"),
        ({**MOE, "dp": 2, "tp": 2, "ep": 2}, "ep", [1], "combining tp and ep > 1 is not yet supported"),
        ({**MOE, "dp": 2, "pp": 2, "ep": 2}, "ep", [1], "combining pp and ep > 1"),
        ({**DENSE, "dp": 1, "tp": 2, "pp": 2}, "pp", [1], "set at most one of tp, pp, ep above 1"),
        ({**MOE, "dp": 1, "pp": 0}, "pp", [1, 2, 3, 4], "out of range"),
        ({"config": "layerwise-empty-rank", "dp": 1, "steps": 6, "save_step": 3, "pp": 2}, "pp", [1],
         "has no pipeline stages"),
        ({**DENSE, "dp": 2, "ep": 2}, "ep", [1], "needs a MoE config"),
        ({**MOE, "dp": 3, "ep": 3}, "ep", [1, 2, 4], "does not divide num_experts 4"),
        ({**MOE, "dp": 1, "ep": 2}, "ep", [1], "must divide dp (1)"),
        ({**MOE, "dp": 2, "ep": 4}, "ep", [1, 2], "must divide dp (2)"),
        ({**MOE, "dp": 2, "ep": 0}, "ep", [1, 2, 3, 4], "out of range"),
        ({**MOE, "dp": 2, "ep": 2.0}, "ep", [1, 2, 3, 4], "must be an integer"),
    ],
)
def test_layouts_megatron_rejects(change: dict, field: str, allowed: list, text: str) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(change)
    err = info.value
    assert err.field == field and str(err).startswith(f"{field}: ")
    assert err.allowed == allowed
    assert text in str(err)


def test_default_layout_is_omitted_so_stored_specs_are_unchanged() -> None:
    spec = RunSpec.from_dict({**MOE, "dp": 2})
    data = spec.to_dict()
    assert not {"tp", "pp", "ep"} & set(data)
    assert RunSpec.from_dict({**MOE, "dp": 2, "tp": 1, "pp": 1, "ep": 1}).to_dict() == data
    layered = RunSpec.from_dict({**MOE, "dp": 2, "ep": 2}).to_dict()
    assert layered["ep"] == 2 and "tp" not in layered and "pp" not in layered


def test_world_size_of_stored_specs() -> None:
    assert RunSpec.from_dict({**MOE, "dp": 2}).world_size == 2
    assert RunSpec.from_dict(RunSpec.from_dict({**MOE, "dp": 2, "tp": 2}).to_dict()).world_size == 4


def test_allowed_values_list_the_layout() -> None:
    values = allowed_values()
    json.dumps(values)
    assert values["tp"]["min"] == 1 and values["tp"]["max"] == 4
    assert values["tp"]["per_config"]["moe-fp32-router"] == [1, 2, 4]
    assert values["tp"]["per_config"]["equal-shards-fp32-head"] == [1]
    assert values["pp"]["supported"] == [1, 2]
    assert values["ep"]["per_config"]["moe-fp32-router"] == [1, 2, 4]
    assert values["ep"]["per_config"]["dense-bf16"] == [1]
    assert values["world_size"]["max"] == 4


def test_configs_list_their_layouts() -> None:
    layouts = {c["name"]: c["layouts"] for c in list_configs()}
    assert layouts["moe-fp32-router"] == {"tp": [1, 2, 4], "pp": [1, 2], "ep": [1, 2, 4]}
    assert layouts["dense-bf16"] == {"tp": [1, 2, 4], "pp": [1, 2], "ep": [1]}
    assert layouts["layerwise-empty-rank"] == {"tp": [1], "pp": [1], "ep": [1]}


def test_steps_must_exceed_the_configs_lr_warmup() -> None:
    # Megatron's scheduler asserts warmup < decay steps: a 3-step run of a 3-step-warmup config must
    # be a 422 naming steps, not a crash inside the job
    with pytest.raises(SpecError, match=r"steps: 3 must exceed .*3 LR warmup steps; allowed: 4\.\.") as exc:
        RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "steps": 3, "save_step": 2})
    assert exc.value.field == "steps"
    assert RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}).steps == 4


@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({**MOE, "dp": 1, "tp": 4, "shape": {"num_attention_heads": 2}}, "tp", "num_attention_heads 2"),
        ({**MOE, "dp": 1, "pp": 2, "shape": {"num_layers": 3}}, "pp", "does not divide num_layers 3"),
        ({**MOE, "dp": 4, "ep": 4, "shape": {"num_experts": 6}}, "ep", "does not divide num_experts 6"),
        ({**MOE, "dp": 1, "tp": 4, "shape": {"ffn_hidden_size": 90}}, "tp", "ffn_hidden_size 90"),
    ],
)
def test_layout_rules_apply_to_the_shaped_model(fields: dict, field: str, text: str) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict(fields)
    assert info.value.field == field and text in str(info.value)
    unshaped = {k: v for k, v in fields.items() if k != "shape"}
    assert RunSpec.from_dict(unshaped).world_size >= 1  # the preset itself allows the layout


# --- resume under another DP layout (resume_dp) ---


def test_resume_dp_is_absent_unless_set_and_keeps_the_check_identity() -> None:
    plain = RunSpec.from_dict(GOOD)
    assert "resume_dp" not in plain.to_dict() and not plain.reshards
    assert plain.phase_dp("resume") == 2 and plain.microbatches("resume") == 2  # the config's own 2
    assert (plain.effective_isolation, plain.effective_tolerance) == ("process", "exact")
    spec = RunSpec.from_dict({**GOOD, "resume_dp": 1})
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["resume_dp"] == 1 and RunSpec.from_dict(data) == spec and spec != plain
    assert (spec.phase_dp("train_and_save"), spec.phase_dp("resume")) == (2, 1)
    # the global batch stays 4 microbatches (2 per rank at DP 2): rank 0 of the resume accumulates all 4
    assert spec.global_microbatches == 4
    assert (spec.microbatches("train_and_save"), spec.microbatches("resume")) == (2, 4)


def test_resume_dp_switches_isolation_and_tolerance_unless_chosen() -> None:
    spec = RunSpec.from_dict({**GOOD, "resume_dp": 1})
    assert (spec.effective_isolation, spec.effective_tolerance) == ("job", "reshard")
    loose = RunSpec.from_dict({**GOOD, "resume_dp": 1, "tolerance": "loose", "isolation": "job"})
    assert (loose.effective_isolation, loose.effective_tolerance) == ("job", "loose")


def test_resume_dp_uneven_sizes_share_the_lcm_batch() -> None:
    spec = RunSpec.from_dict({**GOOD, "dp": 2, "resume_dp": 3})
    assert spec.global_microbatches == 12  # lcm(2, 3) x the config's 2 microbatches
    assert (spec.microbatches("train_and_save"), spec.microbatches("resume")) == (6, 4)


@pytest.mark.parametrize(
    ("change", "message", "allowed_has"),
    [
        ({"resume_dp": 0}, "out of range", None),
        ({"resume_dp": MAX_DP + 1}, "exceeds the maximum", MAX_DP),
        ({"resume_dp": "1"}, "must be an integer", None),
        ({"resume_dp": True}, "must be an integer", None),
        ({"resume_dp": 2}, "equals dp (2); omit it", None),
        ({"config": "equal-shards-fp32-head", "resume_dp": 4}, "exceeds the maximum 2", 2),
        ({"dp": 7, "resume_dp": 8}, "16 per rank at DP 7), more than 8", None),
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


def test_the_plan_of_a_stored_spec_reads_resume_dp() -> None:
    from jobs.protocol import RunPlan

    stored = RunPlan.of(RunSpec.from_dict({**GOOD, "resume_dp": 1}).to_dict())
    assert (stored.tasks("train_and_save"), stored.tasks("resume")) == (2, 1)
    assert stored.isolation == "job"
    plain = RunPlan.of(RunSpec.from_dict(GOOD).to_dict())
    assert plain.tasks("resume") == 2 and plain.isolation == "process"
    legacy = {k: v for k, v in RunSpec.from_dict(GOOD).to_dict().items() if k != "isolation"}
    assert RunPlan.of(legacy).isolation == "job"  # stored before isolation existed
    assert allowed_values()["resume_dp"]["max"] == MAX_DP


def test_a_resume_layout_megatron_would_refuse_is_refused_naming_the_resume_field() -> None:
    # the resume's layout must hold as the save's does: EP 2 needs 2 DP ranks in the resume too
    with pytest.raises(SpecError, match=r"resume_dp: the resume's layout \(dp1ep2\)") as info:
        RunSpec.from_dict({**MOE, "dp": 2, "ep": 2, "resume_dp": 1})
    assert info.value.field == "resume_dp"
    # the task count of each phase is its DP size times the model-parallel sizes
    from jobs.protocol import RunPlan

    stored = RunPlan.of(RunSpec.from_dict({**MOE, "dp": 1, "tp": 2}).to_dict())
    assert (stored.tasks("train_and_save"), stored.tasks("resume")) == (2, 2)
