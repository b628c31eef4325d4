"""The gate exercises every feature the engine knows (jobs/features.py reads the list from the engine's tables).

A new config, sharding type, layout field, optimizer or boolean checkpoint option fails here until a gate
check exercises it, or the engine's table says why no CPU check can (a config's `requires`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from jobs import configs, features
from jobs.spec import RunSpec

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "suites" / "gate.yaml"


def _gate_specs() -> dict[str, RunSpec]:
    checks = yaml.safe_load(GATE.read_text())["checks"]
    return {c["name"]: RunSpec.from_dict(c["spec"]) for c in checks}


def test_every_engine_feature_is_in_a_gate_check() -> None:
    missing = features.uncovered(_gate_specs())
    assert missing == [], f"no gate check exercises {missing}: add one to suites/gate.yaml"
    table = features.coverage(_gate_specs())
    # each CPU config has a check of its own; the GPU ones carry the engine's reason
    for name, cfg in configs.CONFIGS.items():
        row = table[f"config:{name}"]
        assert bool(row["checks"]) == (not cfg.requires), (name, row)
        assert (row["reason"] is None) == (not cfg.requires), (name, row)
    for feature in ("parallel:tp", "parallel:pp", "parallel:ep", "parallel:dp-reshard", "parallel:tp-reshard",
                    "option:async_save",
                    "option:fully_parallel", "optimizer:layerwise-adam", "sharding:dp_zero_gather_scatter",
                    "sharding:fully_reshardable",
                    "megatron:hidden_dropout", "megatron:fp16", "megatron:mtp_num_layers",
                    "megatron:moe_router_enable_expert_bias", "megatron:moe_shared_expert_intermediate_size"):
        assert table[feature]["checks"], feature
    # a format no build can save carries its reason instead of a check
    assert "flattened_range" in table["sharding:fully_sharded_model_space"]["reason"]
    # a resume across EP 1 no build can load (jobs/rank/compat.py names it unsupported-by-build)
    assert "ChainedOptimizer" in table["parallel:ep-reshard"]["reason"]


def test_a_feature_kept_beside_the_gate_is_covered_by_the_suite_it_names() -> None:
    for feature, reason in features.BESIDE_THE_GATE.items():
        suite = ROOT / reason.split()[0]
        specs = {c["name"]: RunSpec.from_dict(c["spec"]) for c in yaml.safe_load(suite.read_text())["checks"]}
        assert features.coverage(specs)[feature]["checks"], (feature, suite)


def test_a_new_config_or_option_is_missing_until_a_check_covers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    base = configs.CONFIGS["dense-bf16"]
    monkeypatch.setitem(configs.CONFIGS, "dense-new", replace(base, name="dense-new"))
    assert features.uncovered(_gate_specs()) == ["config:dense-new"]
    # a GPU-only config needs no CPU check, and says why
    monkeypatch.setitem(configs.CONFIGS, "dense-new", replace(base, name="dense-new", requires=("cuda",)))
    assert features.uncovered(_gate_specs()) == []
    assert features.engine_features()["config:dense-new"] == "a GPU check: needs cuda, absent on CPU"
    # every boolean option of RunSpec is a feature: dropping the checks that set one leaves it uncovered
    assert set(features.option_fields()) >= {"async_save", "fully_parallel"}
    monkeypatch.delitem(configs.CONFIGS, "dense-new")
    without_async = {n: s for n, s in _gate_specs().items() if not s.async_save}
    assert "option:async_save" in features.uncovered(without_async)


def test_a_check_names_the_features_it_exercises() -> None:
    spec = RunSpec.from_dict({"config": "moe-aux-free", "dp": 2, "ep": 2, "steps": 6, "save_step": 3,
                              "fully_parallel": True})
    got = features.spec_features(spec)
    assert {"config:moe-aux-free", "parallel:dp", "parallel:ep", "option:fully_parallel", "sharding:dp_reshardable",
            "optimizer:distributed-adam", "megatron:moe_router_enable_expert_bias", "isolation:process"} <= got
    assert "parallel:tp" not in got and "option:async_save" not in got
    reshard = RunSpec.from_dict({"config": "moe-fp32-router", "dp": 2, "resume_dp": 1, "steps": 6, "save_step": 3})
    assert {"parallel:dp-reshard", "isolation:job"} <= features.spec_features(reshard)


def test_the_documented_feature_table_is_the_generated_one() -> None:
    from jobs import surface_table

    documented = surface_table.table_in(surface_table.DOC.read_text(), surface_table.FEATURES_MARKERS)
    regenerate = ".venv/bin/python -m jobs.surface_table --write docs/detection.md"
    assert documented == features.markdown(_gate_specs()), f"the gate feature table is stale: {regenerate}"
