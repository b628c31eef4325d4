"""The mutant catalogue: resume bugs injected into Megatron-Core at run time, and what must catch them.

Pure data (no torch): the spec validates mutant names against it and the verdict side judges a
run against `expect`. The patches themselves live in jobs/rank/mutants.py and are applied inside
the job (monkeypatches; site-packages is never edited). Benign mutants change how state is held,
not what it is, and must pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BASE_SPEC: dict[str, Any] = {
    "config": "dense-bf16-dropout",
    "steps": 4,
    "save_step": 2,
    "workarounds": ["restore-adam-step"],
}


@dataclass(frozen=True)
class Mutant:
    """One injected fault (or benign change) and the outcome the detector must report."""

    name: str
    kind: str
    description: str
    expect: tuple[str, ...] = ()  # signatures that must be reported; () for a benign change
    verdict: str = "fail"
    forbid: tuple[str, ...] = ()  # signatures that must not be reported
    spec: tuple[tuple[str, Any], ...] = ()  # overrides of BASE_SPEC

    @property
    def benign(self) -> bool:
        """Whether this change must not be flagged."""
        return self.verdict == "pass"

    def run_spec(self, dp: int) -> dict[str, Any]:
        """The spec this mutant runs under at data-parallel size `dp`."""
        return {**BASE_SPEC, **dict(self.spec), "dp": dp, "mutants": [self.name]}


MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant("model-weight-skipped", "model weights",
               "the model load keeps the fresh build's value of one weight", ("model-weights-mismatch",)),
        Mutant("main-params-from-model", "main params",
               "after the optimizer load, FP32 main params are re-derived from the bf16 model weights",
               ("main-params-mismatch",)),
        Mutant("exp-avg-sq-reset", "moments", "after the optimizer load every exp_avg_sq is zero",
               ("optimizer-moments-mismatch",)),
        Mutant("adam-step-saved-off-by-one", "step", "the checkpoint records Adam step N-1",
               ("adam-step-not-restored",)),
        Mutant("scheduler-one-step-behind", "scheduler", "the scheduler loads num_steps N-1",
               ("scheduler-state-mismatch",)),
        Mutant("iteration-one-behind", "iteration", "the checkpoint records iteration N-1",
               ("iteration-mismatch",)),
        Mutant("rng-tracker-not-restored", "rng", "Megatron's RNG tracker ignores set_states on load",
               ("rng-state-mismatch",)),
        Mutant("save-rounds-main-params", "save side effect",
               "building the optimizer checkpoint rounds the live FP32 main params to bf16 in place",
               ("save-mutates-live-state",)),
        Mutant("index-map-swap", "index map",
               "model_param_group_index_map swaps two equal-size params of one group (silent Bug A)",
               ("optimizer-index-misalignment", "optimizer-state-mismatch")),
        Mutant("moments-lost-on-last-rank", "partial restore",
               "only the last rank leaves exp_avg at zero after the load", ("optimizer-moments-mismatch",)),
        Mutant("group-lr-skewed-on-last-rank", "param groups (Bug C)",
               "only the last rank's param groups load a different lr (the scheduler later rewrites it)",
               ("param-group-scalars-mismatch",)),
        Mutant("adam-eps-not-restored", "param groups", "param groups come back with eps 1e-6",
               ("param-group-scalars-mismatch",)),
        Mutant("clip-grad-changed-on-resume", "resumed loop",
               "the resumed run clips gradients at 1e-3: state restores exactly, the loop differs",
               ("final-state-mismatch",)),
        Mutant("build-lacks-sharding-type", "unsupported option",
               "the build raises 'Unknown sharding_type' as 0.13/0.14 do, on a config with Bug A",
               ("unsupported-by-build",), verdict="error", forbid=("optimizer-index-misalignment",),
               spec=(("config", "moe-fp32-router"), ("workarounds", []))),
        Mutant("benign-state-in-new-storage", "benign",
               "after the load every optimizer state tensor is replaced by a copy (same values)", verdict="pass"),
        Mutant("benign-reordered-state-dict", "benign",
               "model and optimizer sharded state dicts are built in reverse key order", verdict="pass"),
        Mutant("benign-rng-drawn-before-load", "benign",
               "random numbers are drawn before the load (the RNG restore must make it harmless)",
               verdict="pass"),
        Mutant("benign-gradient-noise", "benign",
               "every step's gradients get a tiny seeded perturbation, different in each run (GPU noise): "
               "passes under the `default` profile, fails under `exact`", verdict="pass",
               spec=(("tolerance", "default"),)),
    )
}
# A fast subset for CI: one run per DP carries several independent mutants at once.
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
        ok = verdict == "pass" and not sigs
        outcome = "silent" if ok else "false alarm"
    else:
        ok = verdict == mutant.verdict and all(s in sigs for s in mutant.expect)
        ok = ok and not any(s in sigs for s in mutant.forbid)
        outcome = "caught" if ok else "missed"
    return {
        "ok": ok,
        "outcome": outcome,
        "verdict": verdict,
        "signatures": sigs,
        "first_divergent_step": result.get("first_divergent_step"),
    }


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


def health_specs(dp: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """The periodic detector-health batch: a control, the combined faults, one benign change."""
    benign = MUTANTS["benign-reordered-state-dict"]
    return [
        ("control", {**BASE_SPEC, "dp": dp}),
        ("combined", {**BASE_SPEC, "dp": dp, "mutants": list(COMBINED)}),
        (benign.name, benign.run_spec(dp)),
    ]
