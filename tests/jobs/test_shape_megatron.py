"""Custom shapes on real Megatron-Core (CPU): the overrides reach the model, and the detectors still hold.

moe-fp32-router reshaped to 3 layers, hidden 64, 8 experts routed top-1, with the output head kept
in FP32 as well: without workarounds Bug A is flagged, with them the resume is bit-exact. The same
shape with the router FP32 toggle off has no FP32 parameter at all, so Bug A must not show.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobs.contract import ParityResult
from jobs.launch.local import run_parity
from jobs.spec import RunSpec
from tests.plugins.tiers import LazyRuns

pytestmark = pytest.mark.megatron

FIX = ("match-groups-by-lr-bounds", "realign-param-index", "restore-adam-step")  # 0.16.1's known bugs here
SHAPE = {"num_layers": 3, "hidden_size": 64, "num_experts": 8, "moe_router_topk": 1}
SCENARIOS: dict[str, dict[str, Any]] = {
    "known_bad": {"shape": {**SHAPE, "fp32_output_head": True}},
    "known_good": {"shape": {**SHAPE, "fp32_output_head": True}, "workarounds": FIX},
    "no_fp32": {"shape": {**SHAPE, "fp32_router": False},
                "workarounds": ("match-groups-by-lr-bounds", "restore-adam-step")},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> LazyRuns[ParityResult]:
    def run(name: str) -> ParityResult:
        fields = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3, **SCENARIOS[name]}
        return run_parity(RunSpec.from_dict(fields), tmp_path_factory.mktemp(name))

    return LazyRuns(run)


def _probes(result: ParityResult) -> dict[str, Any]:
    probes: dict[str, Any] = dict(result["probes"] or {})
    return dict(probes["train_and_save"])


def _params(result: ParityResult, dtype: str | None = None) -> set[str]:
    """Parameter names (without the wrapper prefix) the train_and_save index-map probe lists."""
    names = set()
    for rank in _probes(result)["index_map"]["per_rank"]:
        for opt in rank["optimizers"]:
            for entry in opt["misaligned"]:
                if dtype is None or entry["dtype"] == dtype:
                    names.add(entry["param"].removeprefix("module.module."))
    return names


def test_known_bad_is_flagged_and_the_fp32_toggles_reach_the_model(results: LazyRuns[ParityResult]) -> None:
    r = results["known_bad"]
    assert r["verdict"] == "fail", r["error"]
    assert "optimizer-index-misalignment" in r["signatures"]
    assert r["spec"]["shape"] == {**SHAPE, "fp32_output_head": True}
    # FP32: the output head (toggled on) and one router per layer (3 layers), nothing else
    assert _params(r, "float32") == {
        "output_layer.weight", *(f"decoder.layers.{i}.mlp.router.weight" for i in range(3))}
    # 8 experts per layer, 3 layers: the shape, not the preset (4 experts, 2 layers)
    experts = {n for n in _params(r) if ".local_experts." in n}
    assert any("layers.2.mlp" in n for n in experts) and any("local_experts.7." in n for n in experts)
    assert not any("local_experts.8." in n for n in experts)


def test_known_good_passes_bit_exactly(results: LazyRuns[ParityResult]) -> None:
    r = results["known_good"]
    assert r["verdict"] == "pass", (r["signatures"], r["error"])
    assert r["first_divergent_step"] is None
    resumed = [s for s in r["steps"] if s["resumed_phase"]]
    assert [s["step"] for s in resumed] == [4, 5, 6]
    assert all(s["loss_baseline"] == s["loss_resumed"] and s["lr_baseline"] == s["lr_resumed"] for s in resumed)


@pytest.mark.nightly  # the no-FP32 side of Bug A runs in the PR tier as the gate's moe-bf16 check
def test_a_shape_without_fp32_params_does_not_trigger_bug_a(results: LazyRuns[ParityResult]) -> None:
    r = results["no_fp32"]
    assert "optimizer-index-misalignment" not in r["signatures"]
    assert _probes(r)["index_map"]["misaligned_total"] == 0
    assert r["verdict"] == "pass", (r["signatures"], r["error"])
