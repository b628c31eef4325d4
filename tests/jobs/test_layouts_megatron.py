"""Parallel layouts end to end: real Megatron-Core on CPU (gloo) at EP 2, TP 2 and PP 2.

Each layout must flag the known-bad runs with the same signatures as plain DP (Bug A on
moe-fp32-router; Adam's step not restored on dense-bf16) and pass bit-exactly with the
workarounds. Runs are tiny (6 steps, save at 3) and use the default isolation ("process").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.contract import ParityResult
from jobs.launch.local import run_parity
from jobs.protocol import RunPlan
from jobs.spec import RunSpec
from tests.plugins.tiers import LazyRuns, tiered

pytestmark = pytest.mark.megatron

# 0.16.1's known bugs on these configs: Bug A, the torch-Adam step, the decoupled LR groups that collide
FIX = ("match-groups-by-lr-bounds", "realign-param-index", "restore-adam-step")
# a resume on another layout (fully_reshardable): its torch-Adam load needs load-absent-step too
MOVED = {"config": "dense-bf16", "dp": 1, "tp": 2, "resume_tp": 1, "sharding": "fully_reshardable",
         "workarounds": ("match-groups-by-lr-bounds", "restore-adam-step", "load-absent-step")}
MOE = {"config": "moe-fp32-router"}
SCENARIOS: dict[str, dict[str, Any]] = {
    "ep2_bad": {**MOE, "dp": 2, "ep": 2},
    "ep2_good": {**MOE, "dp": 2, "ep": 2, "workarounds": FIX},
    "tp2_bad": {**MOE, "dp": 1, "tp": 2},
    "tp2_good": {**MOE, "dp": 1, "tp": 2, "workarounds": FIX},
    # dense-bf16 trains decoupled-LR groups (training revision 2), which 0.16.1 loads into one another: only
    # that bug's workaround, so Adam's step is the one finding left
    "tp2_dense_bad": {"config": "dense-bf16", "dp": 1, "tp": 2, "workarounds": ("match-groups-by-lr-bounds",)},
    "pp2_bad": {**MOE, "dp": 1, "pp": 2},
    "pp2_good": {**MOE, "dp": 1, "pp": 2, "workarounds": FIX},
    "pp2_dense_bad": {"config": "dense-bf16", "dp": 1, "pp": 2, "workarounds": ("match-groups-by-lr-bounds",)},
    # TP 2 -> 1, judged by the bound calibrated for it (jobs/calibration/reshard.json); and with the moments
    # loaded lossily, which that bound must not hide
    "tp2_to_tp1": MOVED,
    "tp2_to_tp1_lossy": {**MOVED, "mutants": ("exp-avg-sq-lossy-on-load",)},
    # the production-shaped GPT: TP 2 pads its vocabulary of 1100 to 1280 rows, TP 1 to 1152
    "gpt_tp2_to_dp2": {**MOVED, "config": "gpt-recipe", "resume_dp": 2},
    # PP 1 -> 2 onto a virtual pipeline: four microbatches run the interleaved schedule's steady state
    "gpt_dp2_to_pp2": {**MOVED, "config": "gpt-recipe", "dp": 2, "tp": 1, "resume_tp": None, "resume_pp": 2,
                       "resume_dp": 1},
}
LAYOUT = {
    "ep2": {"dp": 2, "tp": 1, "pp": 1, "ep": 2, "expert_dp": 1},
    "tp2": {"dp": 1, "tp": 2, "pp": 1, "ep": 1},
    "pp2": {"dp": 1, "tp": 1, "pp": 2, "ep": 1},
}


# The PR tier runs each layout family once with the workarounds (every rank reports its layout); the
# known-bad runs are nightly (Bug A's known-bad side runs in the PR tier in test_parity_megatron).
PR_SLICE = ("ep2_good", "tp2_good", "pp2_good")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> LazyRuns[ParityResult]:
    def run(name: str) -> ParityResult:
        spec = RunSpec.from_dict({"steps": 6, "save_step": 3, **SCENARIOS[name]})
        return run_parity(spec, tmp_path_factory.mktemp(name))

    return LazyRuns(run)


def _rank_docs(result: ParityResult, phase: str) -> list[dict[str, Any]]:
    """Every rank's own document of a phase (the result carries rank 0's)."""
    plan = RunPlan.of(result["spec"])
    docs, _ = plan.rank_documents(plan.attempt_folder(Path(result["run_folder"]), phase, 1), phase)
    return [dict(d) for d in docs]


@pytest.mark.parametrize("name", tiered(["ep2_bad", "tp2_bad", "pp2_bad"], PR_SLICE))
def test_bug_a_is_flagged_in_each_layout(results: LazyRuns[Any], name: str) -> None:
    r = results[name]
    assert r["verdict"] == "fail"
    assert {"optimizer-index-misalignment", "checkpoint-save-crash"} <= set(r["signatures"])
    assert r["error"]["stage"] == "save" and r["error"]["type"] == "AssertionError"
    assert "sharded_param_state_dp_reshardable" in r["error"]["traceback"]
    assert r["evidence"]["optimizer-index-misalignment"]["misaligned_total"] > 0
    assert r["phases"]["resume"] is None


@pytest.mark.parametrize("name", tiered(["ep2_good", "tp2_good", "pp2_good"], PR_SLICE))
def test_workarounds_pass_bit_exactly_in_each_layout(results: LazyRuns[Any], name: str) -> None:
    r = results[name]
    assert r["verdict"] == "pass", (r["signatures"], r["errors"])
    rows = [s for s in r["steps"] if s["resumed_phase"]]
    assert [s["step"] for s in rows] == [4, 5, 6]
    assert all(s["loss_baseline"] == s["loss_resumed"] and s["lr_baseline"] == s["lr_resumed"] for s in rows)
    assert r["first_divergent_step"] is None


@pytest.mark.nightly  # the adam-step detector's PR-tier run is tests/jobs/test_parity_megatron.py's "dense"
@pytest.mark.parametrize("name", ["tp2_dense_bad", "pp2_dense_bad"])
def test_adam_step_not_restored_is_flagged_in_each_layout(results: LazyRuns[Any], name: str) -> None:
    r = results[name]
    assert r["verdict"] == "fail"
    assert r["signatures"] == ["adam-step-not-restored"]  # the same signature as at DP only
    ev = r["evidence"]["adam-step-not-restored"]
    assert ev["step"] == 4 and ev["checkpoint_step"] == 3.0 and ev["adam_steps_after_load"] == [1.0]
    rows = {s["step"]: s for s in r["steps"] if s["resumed_phase"]}
    assert rows[4]["exact"] and not rows[5]["exact"]  # wrong update at N+1 shows in the loss at N+2
    assert r["first_divergent_step"] == 5


def test_every_rank_of_the_layout_ran_and_reports_it(results: LazyRuns[Any]) -> None:
    for name in ("ep2_good", "tp2_good", "pp2_good"):
        want = LAYOUT[name[:3]]
        for phase in ("train_and_save", "resume"):
            docs = _rank_docs(results[name], phase)
            assert len(docs) == 2 and [d["rank"] for d in docs] == [0, 1]
            for d in docs:
                assert d["status"] == "ok"
                assert {k: d["info"]["layout"][k] for k in want} == want
    tp_ranks = [d["info"]["layout"]["tp_rank"] for d in _rank_docs(results["tp2_good"], "resume")]
    assert tp_ranks == [0, 1]
    stages = _rank_docs(results["pp2_good"], "resume")
    assert [d["info"]["layout"]["pp_rank"] for d in stages] == [0, 1]
    # each stage holds its own part of the model; both record the last stage's loss
    first, last = (set(d["probes"]["state_after_load_raw"][d["rank"]]["model"]) for d in stages)
    assert any("embedding" in n for n in first) and not any("output_layer" in n for n in first)
    assert any("output_layer" in n for n in last) and not any("embedding" in n for n in last)
    assert [s["loss"] for s in stages[0]["steps"]] == [s["loss"] for s in stages[1]["steps"]]


@pytest.mark.nightly  # reads ep2_bad, a nightly scenario
def test_ep2_probes_cover_the_expert_optimizer(results: LazyRuns[Any]) -> None:
    # dense and expert params sit in two DistributedOptimizers of a ChainedOptimizer: both probed, named
    for name in ("ep2_bad", "ep2_good"):
        probe = _rank_docs(results[name], "train_and_save")[0]["probes"]["index_map"]
        for rank in probe["per_rank"]:
            kinds = [(o["kind"], o["dp_group_size"]) for o in rank["optimizers"]]
            assert kinds == [("dense", 2), ("expert", 1)]
            assert [c["kind"] for c in rank["chain"]] == ["dense", "expert"]
            dense, expert = rank["optimizers"]
            assert dense["misaligned_count"] > 0 and expert["entries"] > 0
            assert all(m["optimizer_kind"] == "dense" for m in dense["misaligned"])
        buckets = _rank_docs(results[name], "train_and_save")[0]["probes"]["buckets"]
        assert {b["kind"] for rank in buckets["per_rank"] for b in rank["buffers"]} == {"dense", "expert"}
    realign = results["ep2_good"]["phases"]["train_and_save"]["workarounds"]["realign-param-index"]
    assert [o["optimizer"] for o in realign["per_rank"][0]["optimizers"]] == [0, 1]


def test_layout_is_in_the_result_spec(results: LazyRuns[Any]) -> None:
    assert (results["ep2_good"]["spec"]["ep"], results["ep2_good"]["spec"]["dp"]) == (2, 2)
    assert results["tp2_good"]["spec"]["tp"] == 2 and "ep" not in results["tp2_good"]["spec"]


@pytest.mark.nightly  # a resume on another layout: two jobs per run (the PR tier's reshard is DP 2 -> 1)
def test_a_resume_on_another_tensor_parallel_size_is_judged_in_one_view(results: LazyRuns[Any]) -> None:
    """Saved at TP 2, resumed at TP 1: every restored tensor equals the saved one in the layout-free view
    (the load is a copy), the run passes by the calibrated bound, and a lossy moment load fails naming the
    tensor by its checkpoint key."""
    clean = results["tp2_to_tp1"]
    assert clean["verdict"] == "pass", (clean["signatures"], clean["errors"])
    assert clean["reshard"]["layouts"] == {"train_and_save": "dp1tp2", "resume": "dp1"}
    assert clean["reshard"]["tolerance"] == "reshard:dense-bf16:dp1tp2->dp1@3"
    saved = clean["probes"]["train_and_save"]["state_at_save"][0]
    restored = clean["probes"]["resume"]["state_after_load"][0]
    assert saved["view"]["kind"] == restored["view"]["kind"] == "layout-free"
    assert (saved["view"]["ranks"], restored["view"]["ranks"]) == ("2", "1")
    for section in ("model", "main", "moments"):
        assert saved[section] == restored[section] and saved[section]
    lossy = results["tp2_to_tp1_lossy"]
    assert lossy["verdict"] == "fail" and "optimizer-moments-mismatch" in lossy["signatures"]
    assert "exp_avg_sq loaded wrong" in lossy["cause_lines"]["optimizer-moments-mismatch"]


@pytest.mark.nightly  # suites/layouts.yaml's reshard-tp2-to-dp2 runs the same change through the service
def test_a_tp_change_across_a_vocabulary_padding_change_is_judged_on_the_rows_both_sizes_hold(
    results: LazyRuns[Any]
) -> None:
    """TP 2 holds 1280 rows of the 1100-token vocabulary and TP 1 1152: Megatron-Core loads the 1152 both hold
    (allow_shape_mismatch), the view compares those bit for bit and says how many each side held, and the run
    passes by the bound calibrated for the change."""
    r = results["gpt_tp2_to_dp2"]
    assert r["verdict"] == "pass", (r["signatures"], r["errors"])
    saved = r["probes"]["train_and_save"]["state_at_save"][0]
    restored = r["probes"]["resume"]["state_after_load"][0]
    assert (saved["view"]["vocab_rows_held"], restored["view"]["vocab_rows_held"]) == ("1280", "1152")
    assert saved["view"]["vocab_rows_compared"] == restored["view"]["vocab_rows_compared"] == "1152"
    assert saved["model"]["embedding.word_embeddings.weight"].startswith("bfloat16[1152, 128]")
    for section in ("model", "main", "moments"):
        assert saved[section] == restored[section] and saved[section]


@pytest.mark.nightly
def test_a_resume_onto_a_virtual_pipeline_computes_its_first_step_as_the_saving_layout_did(
    results: LazyRuns[Any]
) -> None:
    """From the same restored state, PP 2 x VPP 2 with four microbatches must compute the loss PP 1 x DP 2 computed:
    batched P2P at PP 2 swapped activations and grads past the warmup (4e-3 of loss)."""
    r = results["gpt_dp2_to_pp2"]
    assert r["verdict"] == "pass", (r["signatures"], r["errors"])
    first = next(s for s in r["steps"] if s["resumed_phase"])
    assert first["loss_baseline"] == first["loss_resumed"]
