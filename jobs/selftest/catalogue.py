"""The mutant catalogue: resume bugs injected into Megatron-Core at run time, and what must catch them.

Pure data (no torch): the spec validates mutant names against it and the verdict side judges a
run against `expect`. The patches themselves live in jobs/rank/mutants.py and are applied inside
the job (monkeypatches; site-packages is never edited). Benign mutants change how state is held,
not what it is, and must pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobs.signature_names import (
    ADAM_STEP_NOT_RESTORED,
    ADAM_STEP_UNEXPLAINED,
    FINAL_STATE_MISMATCH,
    ITERATION_MISMATCH,
    LOSS_SCALER_MISMATCH,
    LR_SCHEDULE_MISMATCH,
    MAIN_PARAMS_MISMATCH,
    MODEL_WEIGHTS_MISMATCH,
    OPTIMIZER_INDEX_MISALIGNMENT,
    OPTIMIZER_INDEX_UNEXPLAINED,
    OPTIMIZER_MOMENTS_MISMATCH,
    OPTIMIZER_STATE_MISMATCH,
    PARAM_GROUP_SCALARS_MISMATCH,
    RNG_STATE_MISMATCH,
    SAVE_MUTATES_LIVE_STATE,
    SCHEDULER_STATE_MISMATCH,
    UNSUPPORTED_BY_BUILD,
)
from jobs.verdict_names import ERROR, FAIL, PASS

BASE_SPEC: dict[str, Any] = {
    "config": "dense-bf16-dropout",
    "steps": 4,
    "save_step": 2,
    "workarounds": ["match-groups-by-lr-bounds", "restore-adam-step"],
}
# The specs a mutant runs on (the dp is added per run). Every base passes bit-exactly without a
# mutant; each carries the workarounds its config needs on 0.16.1 (README: the torch-Adam step bug,
# Bug A on FP32 routers, the param groups that differ in their LR bounds only), so a mutant is the only
# thing that can make it fail.
_SHORT = {"steps": 4, "save_step": 2}
_STEP = ["match-groups-by-lr-bounds", "restore-adam-step"]  # every GPT config on 0.16.1
_BUG_A = ["match-groups-by-lr-bounds", "realign-param-index", "restore-adam-step"]  # and FP32 params among bf16
BASES: dict[str, dict[str, Any]] = {
    "dense-bf16": {"config": "dense-bf16", **_SHORT, "workarounds": _STEP},
    "moe-fp32-router": {"config": "moe-fp32-router", **_SHORT,
                        "workarounds": _BUG_A},
    "dense-bf16-dropout": dict(BASE_SPEC),
    "moe-aux-free": {"config": "moe-aux-free", **_SHORT, "workarounds": _STEP},
    "dense-fp16": {"config": "dense-fp16", **_SHORT, "workarounds": _STEP},
    "moe-shared-expert": {"config": "moe-shared-expert", **_SHORT, "workarounds": _STEP},
    "gpt-mtp": {"config": "gpt-mtp", **_SHORT, "workarounds": _STEP},
    "gpt-mtp-fp32-proj": {"config": "gpt-mtp-fp32-proj", **_SHORT,
                          "workarounds": _BUG_A},
    # every option beyond the production defaults (VPP at PP 2, WSD, bf16 reduce, ...): saved inside the warmup
    "gpt-recipe": {"config": "gpt-recipe", "steps": 6, "save_step": 2,
                   "workarounds": ["restore-adam-step", "match-groups-by-lr-bounds"]},
    # checkpoint I/O strategies are spec variations: shown here on dense-bf16
    "dense-bf16+async": {"config": "dense-bf16", **_SHORT, "workarounds": _STEP,
                         "async_save": True},
    "dense-bf16+fully-parallel": {"config": "dense-bf16", **_SHORT, "workarounds": _STEP,
                                  "fully_parallel": True},
}
# The self-test matrix: every general mutant on both, at DP 1 and 2 (feature mutants on their own base).
MATRIX_BASES = ("dense-bf16", "moe-fp32-router")
LAYERS = ("megatron-core", "harness")

_DO = "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer"
_F16 = "megatron.core.transformer.module.Float16Module"
_SCHED = "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler"


@dataclass(frozen=True)
class Mutant:
    """One injected fault (or benign change) and the outcome the detector must report."""

    name: str
    kind: str
    description: str
    expect: tuple[str, ...] = ()  # signatures that must be reported; () for a benign change
    verdict: str = FAIL
    forbid: tuple[str, ...] = ()  # signatures that must not be reported
    spec: tuple[tuple[str, Any], ...] = ()  # overrides of the base spec
    patches: str = ""  # the dotted name of what the injection wraps
    # (signature, regex): the signature's evidence must name an item (or section) matching it
    evidence: tuple[tuple[str, str], ...] = ()
    bases: tuple[str, ...] = MATRIX_BASES  # the base specs it runs on (first: the default)
    sibling: str = ""  # a harness mutant's Megatron-Core counterpart (same signature)
    min_dp: int = 1  # the smallest DP where the patched code path runs at all
    note: str = ""

    @property
    def benign(self) -> bool:
        """Whether this change must not be flagged."""
        return self.verdict == PASS

    @property
    def layer(self) -> str:
        """What the injection patches: `megatron-core` or `harness` (this project's own code)."""
        return "megatron-core" if self.patches.startswith("megatron.core.") else "harness"

    def run_spec(self, dp: int, base: str | None = None) -> dict[str, Any]:
        """The spec this mutant runs under at data-parallel size `dp` on `base` (default: its first)."""
        return {**BASES[base or self.bases[0]], **dict(self.spec), "dp": dp, "mutants": [self.name]}


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("model-weight-skipped", "model weights",
               "the model load keeps the fresh build's value of one weight", (MODEL_WEIGHTS_MISMATCH,),
               patches=f"{_F16}.load_state_dict",
               evidence=((MODEL_WEIGHTS_MISMATCH, r"word_embeddings\.weight$"),
                         (MODEL_WEIGHTS_MISMATCH, r"^model embedding\.word_embeddings\.weight skipped by the load$"))),
        Mutant("main-params-from-model", "main params",
               "after the optimizer load, FP32 main params are re-derived from the bf16 model weights",
               (MAIN_PARAMS_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((MAIN_PARAMS_MISMATCH, r"\.weight$"),)),
        Mutant("exp-avg-sq-reset", "moments", "after the optimizer load every exp_avg_sq is zero",
               (OPTIMIZER_MOMENTS_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((OPTIMIZER_MOMENTS_MISMATCH, r"/exp_avg_sq$"),)),
        Mutant("adam-step-saved-off-by-one", "step", "the checkpoint records Adam step N-1",
               (ADAM_STEP_NOT_RESTORED,), patches=f"{_DO}.state_dict",
               evidence=((ADAM_STEP_NOT_RESTORED, r"\.weight$"),),
               note="on 0.16.1 every dp_reshardable load leaves step 1 anyway, so the recorded step "
               "only matters through restore-adam-step (the workaround re-applies it)"),
        Mutant("index-map-swap-beside-bug-a", "index map",
               "model_param_group_index_map swaps two equal-size params of one group on a build where Bug A "
               "also fires and realign-param-index is requested",
               (OPTIMIZER_INDEX_UNEXPLAINED,), patches=f"{_DO}.__init__", bases=("moe-fp32-router",),
               evidence=((OPTIMIZER_INDEX_UNEXPLAINED, r"\."),),
               note="the workaround corrects only the entries at Bug A's predicted slots: the swapped ones are "
               "left as built and named, so the known bug's workaround never hides a new index-map bug"),
        Mutant("exp-avg-sq-lossy-on-load", "moments",
               "after the optimizer load every exp_avg_sq has passed through bf16 (a lossy restore of one moment)",
               (OPTIMIZER_MOMENTS_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((OPTIMIZER_MOMENTS_MISMATCH, r"exp_avg_sq"),
                         (OPTIMIZER_MOMENTS_MISMATCH, r"^moments .*/exp_avg_sq loaded wrong$")),
               note="small enough to hide inside a loss tolerance; the restored state is compared exactly, at "
               "one DP size and across a reshard"),
        Mutant("adam-step-loaded-elsewhere", "step",
               "after the optimizer load every Adam step is 100 past the loaded value",
               (ADAM_STEP_UNEXPLAINED,), patches=f"{_DO}.load_state_dict",
               evidence=((ADAM_STEP_UNEXPLAINED, r"^step$"),),
               note="restore-adam-step corrects only the priming value or a shared step tensor (the known "
               "torch-Adam bugs); any other value is left as loaded and named"),
        Mutant("scheduler-one-step-behind", "scheduler", "the scheduler loads num_steps N-1",
               (SCHEDULER_STATE_MISMATCH,), patches="megatron.core.optimizer_param_scheduler."
               "OptimizerParamScheduler.load_state_dict",
               evidence=((SCHEDULER_STATE_MISMATCH, r"^num_steps$"),
                         (SCHEDULER_STATE_MISMATCH, r"^scheduler scheduler\.num_steps loaded wrong$"))),
        Mutant("iteration-one-behind", "iteration", "the checkpoint records iteration N-1",
               (ITERATION_MISMATCH,), patches="jobs.rank.checkpoint.build_save_state",
               evidence=((ITERATION_MISMATCH, r"^iteration$"),), sibling="common-state-iteration-stale"),
        Mutant("common-state-iteration-stale", "iteration",
               "dist_checkpointing's common-state reader (common.pt) hands back iteration N-1",
               (ITERATION_MISMATCH,), patches="megatron.core.dist_checkpointing.strategies.common."
               "TorchCommonLoadStrategy.load_common",
               evidence=((ITERATION_MISMATCH, r"^iteration$"),)),
        Mutant("rng-tracker-not-restored", "rng", "Megatron's RNG tracker ignores set_states on load",
               (RNG_STATE_MISMATCH,), patches="megatron.core.tensor_parallel.random."
               "CudaRNGStatesTracker.set_states",
               evidence=((RNG_STATE_MISMATCH, r"^tracker/"),
                         (RNG_STATE_MISMATCH, r"^RNG rng_state/tracker/\S+ skipped by the load$")),
               note="megatron-core has no RNG checkpointing of its own: the call comes from the harness's "
               "restore, as from Megatron-LM's trainer"),
        Mutant("save-rounds-main-params", "save side effect",
               "building the optimizer checkpoint rounds the live FP32 main params to bf16 in place",
               (SAVE_MUTATES_LIVE_STATE,), patches=f"{_DO}.sharded_state_dict",
               evidence=((SAVE_MUTATES_LIVE_STATE, r"^main$"),)),
        Mutant("index-map-swap", "index map",
               "model_param_group_index_map swaps two equal-size params of one group (silent Bug A)",
               (OPTIMIZER_INDEX_MISALIGNMENT, OPTIMIZER_STATE_MISMATCH), patches=f"{_DO}.__init__",
               bases=("dense-bf16",),
               note="not on moe-fp32-router: realign-param-index, which that config needs for Bug A, rebuilds "
               "the map and undoes the swap (measured: pass (worked around)); without it Bug A's save "
               "assertion fires first"),
        Mutant("moments-lost-on-last-rank", "partial restore",
               "only the last rank leaves exp_avg at zero after the load", (OPTIMIZER_MOMENTS_MISMATCH,),
               patches=f"{_DO}.load_state_dict", evidence=((OPTIMIZER_MOMENTS_MISMATCH, r"/exp_avg$"),)),
        Mutant("group-lr-skewed-on-last-rank", "param groups (Bug C)",
               "only the last rank's param groups load a different lr (the scheduler later rewrites it)",
               (PARAM_GROUP_SCALARS_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((PARAM_GROUP_SCALARS_MISMATCH, r"\.lr$"),)),
        Mutant("adam-eps-not-restored", "param groups", "param groups come back with eps 1e-6",
               (PARAM_GROUP_SCALARS_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((PARAM_GROUP_SCALARS_MISMATCH, r"\.eps$"),)),
        Mutant("clip-grad-changed-on-resume", "resumed loop",
               "the resumed run clips gradients at 1e-3: state restores exactly, the loop differs",
               (FINAL_STATE_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((FINAL_STATE_MISMATCH, r"^main$"),)),
        Mutant("scheduler-ignores-group-lr-bounds", "applied LR (per param group)",
               "the resumed scheduler gives every group the default LR bounds: the embedding's decoupled group "
               "trains at the default LR while the first group (the step record's lr) is unchanged",
               (LR_SCHEDULE_MISMATCH,), patches=f"{_SCHED}.get_lr",
               evidence=((LR_SCHEDULE_MISMATCH, r"^applied lr o0\.g1$"),), bases=("gpt-recipe",)),
        Mutant("rerun-machine-disabled-on-resume", "rerun state machine",
               "the resumed process starts Megatron's rerun state machine disabled: nothing validates its grads",
               (ITERATION_MISMATCH,), patches="megatron.core.rerun_state_machine.initialize_rerun_state_machine",
               evidence=((ITERATION_MISMATCH, r"rerun_state_machine\.mode"),), bases=("gpt-recipe",)),
        Mutant("build-lacks-sharding-type", "unsupported option",
               "the build raises 'Unknown sharding_type' as 0.13/0.14 do, on a config with Bug A",
               (UNSUPPORTED_BY_BUILD,), verdict=ERROR, forbid=(OPTIMIZER_INDEX_MISALIGNMENT,),
               spec=(("workarounds", []),), patches=f"{_DO}.sharded_state_dict",
               bases=("moe-fp32-router", "dense-bf16")),
        Mutant("expert-bias-zeroed-on-load", "expert bias (aux-loss-free routing)",
               "after the model load every router's expert_bias is zero (the fresh build's value)",
               (MODEL_WEIGHTS_MISMATCH,), patches=f"{_F16}.load_state_dict",
               evidence=((MODEL_WEIGHTS_MISMATCH, r"router\.expert_bias$"),), bases=("moe-aux-free",)),
        Mutant("expert-bias-not-checkpointed", "expert bias (aux-loss-free routing)",
               "every router registers expert_bias as a non-persistent buffer: the checkpoint lacks it and "
               "the resume keeps the fresh build's zeros (the restore diff, which skips non-persistent "
               "buffers, cannot see it; the final state does)",
               (FINAL_STATE_MISMATCH,), patches="megatron.core.transformer.moe.router.TopKRouter.__init__",
               evidence=((FINAL_STATE_MISMATCH, r"router\.expert_bias absent from the checkpoint$"),),
               bases=("moe-aux-free",)),
        Mutant("loss-scaler-not-restored", "fp16 loss scaler",
               "the dynamic loss scaler ignores its checkpointed state (scale, growth, hysteresis) on load",
               (LOSS_SCALER_MISMATCH,), patches="megatron.core.optimizer.grad_scaler."
               "DynamicGradScaler.load_state_dict",
               # whichever of its state differs at the save shows: dense-fp16 saves mid growth interval, where
               # the scale is still the initial one and the growth tracker is not
               evidence=((LOSS_SCALER_MISMATCH, r"\.(scale|growth_tracker)$"),
                         (LOSS_SCALER_MISMATCH,
                          r"^scaler optimizer\.grad_scaler\.(scale|growth_tracker) skipped by the load$")),
               bases=("dense-fp16",)),
        Mutant("shared-expert-weight-skipped", "shared experts",
               "the model load keeps the fresh build's value of the first shared-expert weight",
               (MODEL_WEIGHTS_MISMATCH,), patches=f"{_F16}.load_state_dict",
               evidence=((MODEL_WEIGHTS_MISMATCH, r"shared_experts\.linear_fc\d\.weight$"),),
               bases=("moe-shared-expert",)),
        Mutant("mtp-head-skipped-on-load", "multi-token prediction",
               "the model load leaves every MTP parameter (module.mtp.*) at the fresh build's value",
               (MODEL_WEIGHTS_MISMATCH,), patches=f"{_F16}.load_state_dict",
               evidence=((MODEL_WEIGHTS_MISMATCH, r"\.mtp\.layers\.0\..*weight$"),),
               bases=("gpt-mtp", "gpt-mtp-fp32-proj")),
        Mutant("mtp-moments-swapped", "multi-token prediction",
               "after the optimizer load each MTP layer's enorm and hnorm hold each other's Adam moments "
               "(restored onto the wrong params; equal shapes, so nothing raises)",
               (OPTIMIZER_MOMENTS_MISMATCH,), patches=f"{_DO}.load_state_dict",
               evidence=((OPTIMIZER_MOMENTS_MISMATCH, r"\.mtp\.layers\.0\.[eh]norm\.weight/exp_avg(_sq)?$"),),
               bases=("gpt-mtp", "gpt-mtp-fp32-proj")),
        Mutant("async-save-stages-late", "async save",
               "the async request is staged and forked only when the trainer next polls, after step N+1: "
               "the step-N checkpoint holds step N+1's optimizer state", (MAIN_PARAMS_MISMATCH,
                                                                          OPTIMIZER_MOMENTS_MISMATCH),
               patches="megatron.core.dist_checkpointing.strategies.async_utils.TemporalAsyncCaller."
               "schedule_async_call", evidence=((MAIN_PARAMS_MISMATCH, r"\.weight$"),
                                                (OPTIMIZER_MOMENTS_MISMATCH, r"/exp_avg$")),
               bases=("dense-bf16+async",)),
        Mutant("fully-parallel-exchange-lost-on-last-rank", "fully-parallel load",
               "the fully-parallel load's exchange gives the last rank zeros for the embedding",
               (MODEL_WEIGHTS_MISMATCH,),
               patches="megatron.core.dist_checkpointing.strategies.fully_parallel."
               "FullyParallelLoadStrategyWrapper.fill_in_deferred_sharded_tensors",
               evidence=((MODEL_WEIGHTS_MISMATCH, r"word_embeddings\.weight$"),),
               bases=("dense-bf16+fully-parallel",), min_dp=2,
               note="at DP 1 the wrapper loads directly (no exchange): measured pass, so it runs from DP 2"),
        Mutant("benign-state-in-new-storage", "benign",
               "after the load every optimizer state tensor is replaced by a copy (same values): fools a "
               "detector that compares storage or data_ptr", verdict=PASS, patches=f"{_DO}.load_state_dict"),
        Mutant("benign-load-priming-noise", "benign",
               "the load-priming dummy optimizer state is random instead of zero: the load overwrites every "
               "value, so a detector must compare restored values, not 'was it initialised'", verdict=PASS,
               patches=f"{_DO}._init_optimizer_states_with_dummy_values"),
        Mutant("benign-stale-grads-after-load", "benign",
               "the grad buffers hold junk after the load: every step zeroes them before backward, so a "
               "detector that fingerprints every tensor the optimizer touches would cry wolf", verdict=PASS,
               patches=f"{_DO}.load_state_dict"),
        Mutant("benign-rng-drawn-before-load", "benign",
               "random numbers are drawn before the load (the RNG restore must make it harmless)",
               verdict=PASS, patches=f"{_DO}.load_state_dict"),
        Mutant("benign-gradient-noise", "benign",
               "every step's gradients get a tiny seeded perturbation, different in each run (GPU noise): "
               "passes under the `default` profile, fails under `exact`", verdict=PASS,
               spec=(("tolerance", "default"),),
               patches="megatron.core.optimizer.optimizer.MixedPrecisionOptimizer.prepare_grads"),
    )
}
# A smoke test only (members mask each other: see `judge`); the catalogue proves each mutant alone.
COMBINED = (
    "model-weight-skipped",
    "main-params-from-model",
    "exp-avg-sq-reset",
    "scheduler-one-step-behind",
    "iteration-one-behind",
    "rng-tracker-not-restored",
    "save-rounds-main-params",
    "group-lr-skewed-on-last-rank",
)


def mutant_names() -> list[str]:
    """Every mutant's name, in catalogue order."""
    return list(MUTANTS)


def judge(mutant: Mutant | None, result: Mapping[str, Any]) -> dict[str, Any]:
    """Compare a run's verdict with what the catalogue expects: caught, missed or false alarm."""
    sigs = list(result.get("signatures") or [])
    verdict = result.get("verdict")
    if mutant is None or mutant.benign:
        ok = verdict == PASS and not sigs
        outcome = "silent" if ok else "false alarm"
    else:
        ok = verdict == mutant.verdict and all(s in sigs for s in mutant.expect)
        ok = ok and not any(s in sigs for s in mutant.forbid)
        outcome = "caught" if ok else "missed"
    row: dict[str, Any] = {
        "ok": ok,
        "outcome": outcome,
        "verdict": verdict,
        "signatures": sigs,
        "first_divergent_step": result.get("first_divergent_step"),
    }
    if mutant is not None and mutant.evidence and "evidence" in result:
        # caught for the right reason: each expected signature names what the mutant broke
        missing = evidence_missing(mutant, result.get("evidence") or {})
        row["evidence_names"] = evidence_names(mutant, result.get("evidence") or {})
        row["evidence_missing"] = missing
        if missing and ok:
            row.update(ok=False, outcome="wrong evidence")
    return row


def _named(ev: Mapping[str, Any]) -> list[str]:
    """The names (items and sections) one signature's evidence points at."""
    names = [str(n) for n in ev.get("names") or []]
    # what the resume lost, as the cause line reads it: "section name how"
    found = ev.get("lost")
    lost: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    rows = [r for r in lost.get("items") or [] if isinstance(r, Mapping)]
    names += [f"{r.get('section')} {r.get('name')} {r.get('how')}" for r in rows]
    names += [str(s) for s in ev.get("sections") or []]
    if isinstance(ev.get("section"), str):
        names.append(ev["section"])
    return names


def evidence_names(mutant: Mutant, evidence: Mapping[str, Any]) -> dict[str, list[str]]:
    """For each signature the mutant expects evidence of: the names the run's evidence gives."""
    return {sig: _named(evidence.get(sig) or {})[:6] for sig, _ in mutant.evidence}


def evidence_missing(mutant: Mutant, evidence: Mapping[str, Any]) -> list[str]:
    """`signature ~ regex` for every expected evidence the run's evidence does not name."""
    return [
        f"{sig} ~ {pattern}"
        for sig, pattern in mutant.evidence
        if not any(re.search(pattern, n) for n in _named(evidence.get(sig) or {}))
    ]


def combined_mutant() -> Mutant:
    """The CI subset as one mutant: every COMBINED fault at once, expecting all their signatures."""
    expect = tuple(dict.fromkeys(s for name in COMBINED for s in MUTANTS[name].expect))
    return Mutant("combined", "combined", "independent faults injected together: " + ", ".join(COMBINED), expect)


def expectation(mutants: list[str] | tuple[str, ...]) -> Mutant | None:
    """What a run with these mutants must report (None: a clean control that must pass)."""
    names = sorted(mutants)
    if not names:
        return None
    if len(names) == 1:
        return MUTANTS[names[0]]
    if names == sorted(COMBINED):
        return combined_mutant()
    expect = tuple(dict.fromkeys(s for n in names for s in MUTANTS[n].expect))
    return Mutant("+".join(names), "combined", "several mutants", expect)


def catalogue_runs(
    dps: tuple[int, ...] = (1, 2), bases: tuple[str, ...] = MATRIX_BASES, names: list[str] | None = None
) -> list[tuple[str, Mutant | None, str, int]]:
    """The one-mutant-per-run matrix: (row name, mutant or None for a control, base, dp).

    A mutant runs on each of `bases` it supports; a feature mutant (its own base only, such as the
    expert bias on `moe-aux-free`) runs there, with that base's control.
    """
    chosen = [MUTANTS[n] for n in (names or list(MUTANTS))]
    plan: dict[str, list[Mutant]] = {b: [m for m in chosen if b in m.bases] for b in bases}
    for m in chosen:
        if not set(m.bases) & set(bases):
            plan.setdefault(m.bases[0], []).append(m)
    out: list[tuple[str, Mutant | None, str, int]] = []
    for dp in dps:
        for base, members in plan.items():
            members = [m for m in members if dp >= m.min_dp]
            if not members and (names or base not in bases):
                continue  # a control only where some mutant runs (every matrix base keeps its own)
            out.append((f"control@{base}", None, base, dp))
            out += [(f"{m.name}@{base}", m, base, dp) for m in members]
    return out


def health_specs(dp: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """The periodic detector-health batch: the whole catalogue one mutant per run, plus the combined smoke."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for name, mutant, base, d in catalogue_runs((dp,)):
        rows.append((name, {**BASES[base], "dp": d} if mutant is None else mutant.run_spec(d, base)))
    rows.append(("combined", {**BASE_SPEC, "dp": dp, "mutants": list(COMBINED)}))
    return rows
