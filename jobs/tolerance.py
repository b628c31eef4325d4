"""Named tolerance profiles: every lane of a parity comparison and the final state, bounded numerically.

A step is within tolerance when |resumed - baseline| <= atol + rtol * |baseline| (numpy.isclose
semantics), for loss, learning rate and the metrics (grad norm, num-zeros) separately, and
`update_successful` is equal. The final state is within tolerance when the discrete sections
(steps, groups, scheduler, iteration, rng) are identical and, per numeric section (model, main,
moments), no item's relative L2 distance `||resumed - baseline|| / ||baseline||` exceeds the
profile's state bound (jobs/rank/probes/final_numeric.py). `exact` is bit-exact everywhere.
`max_failing_steps` mirrors Megatron-LM's functional ckpt-resume test, which allows up to
max(1, n/100) failing steps in its 5 % lane.

A resume at another DP size is judged by a profile *measured* for its config and direction:
`parity calibrate` runs clean reshard resumes and records their largest deltas in
`jobs/calibration/reshard.json`; `calibrated_reshard_profile` puts the bounds a small factor
above them. A reshard no measurement covers is not judged (the verdict is `error`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

NUMERIC_STATE_SECTIONS = ("model", "main", "moments")
CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration" / "reshard.json"
# Bounds measured on GPUs, kept apart from the CPU ones: a cuda check's noise (repeated clean resumes at one
# layout, benchmarks/gpu_gate.py) and its reshards, keyed `cuda/<config>:...` (device_key). Empty until a GPU
# run writes it: no bound in this repository has been measured on a GPU yet (docs/measurements.md).
GPU_CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration" / "gpu.json"
# A calibrated bound is this many times the largest delta measured on clean runs, and at least the floor
# (a delta measured as 0 over a few seeds is not proof that one float32 rounding cannot move it).
CALIBRATION_FACTOR = 4.0
CALIBRATION_FLOOR = 1e-7


@dataclass(frozen=True)
class ToleranceProfile:
    """rtol/atol for loss and lr, plus how many resumed steps may exceed them."""

    name: str
    description: str
    loss_rtol: float
    loss_atol: float
    lr_rtol: float
    lr_atol: float
    allow_failing_fraction: float = 0.0  # of resumed steps; at least 1 step when > 0
    # relative tolerance of grad norm and num-zeros; None: the loss's (every profile but reshard)
    metrics_rtol: float | None = None
    # the final state's numeric sections: largest relative L2 distance of one item (0: bit-exact)
    state_rtol: float = 0.0
    # calibrated profiles: a bound per numeric section, overriding state_rtol; and where they come from
    state_rtol_by_section: tuple[tuple[str, float], ...] = ()
    source: str | None = None

    @property
    def exact(self) -> bool:
        """Whether the profile allows no difference at all (the final state is compared by fingerprint)."""
        bounds = (self.loss_rtol, self.loss_atol, self.lr_rtol, self.lr_atol, self.metrics_rtol or 0.0,
                  self.state_rtol, *(b for _, b in self.state_rtol_by_section))
        return not any(bounds) and self.allow_failing_fraction <= 0

    def state_bound(self, section: str) -> float:
        """The bound on one numeric section of the final state."""
        return dict(self.state_rtol_by_section).get(section, self.state_rtol)

    def metrics_bound(self) -> float:
        """The relative tolerance of grad norm and num-zeros."""
        return self.loss_rtol if self.metrics_rtol is None else self.metrics_rtol

    def bound_label(self) -> str:
        """The bounds in a few words, for the verdict label."""
        state = max((self.state_bound(s) for s in NUMERIC_STATE_SECTIONS), default=0.0)
        return (f"{self.name}: loss {self.loss_rtol:.2g}, grad norm {self.metrics_bound():.2g}, "
                f"state {state:.2g}" + (f" ({self.source})" if self.source else ""))

    def max_failing_steps(self, n_steps: int) -> int:
        """Return how many resumed steps may fall outside tolerance."""
        if self.allow_failing_fraction <= 0:
            return 0
        return max(1, int(n_steps * self.allow_failing_fraction))

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as plain data (metrics_rtol only when set, so older results read alike)."""
        out = asdict(self)
        if self.metrics_rtol is None:
            del out["metrics_rtol"]
        if self.state_rtol_by_section:
            out["state_rtol_by_section"] = dict(self.state_rtol_by_section)
        else:
            del out["state_rtol_by_section"]
        if self.source is None:
            del out["source"]
        return out


TOLERANCE_PROFILES: dict[str, ToleranceProfile] = {
    p.name: p
    for p in (
        ToleranceProfile(
            "exact", "bit-identical loss, lr, grad norm, num-zeros and final state (deterministic CPU runs)",
            0.0, 0.0, 0.0, 0.0,
        ),
        # GPU noise. Measured on CPU with the benign-gradient-noise mutant (a seeded relative
        # perturbation of every step's gradients, different in each run: 1e-7, and 1e-6 to check the
        # size hardly matters), dense-bf16-dropout, save at 2 of 10, DP 1 and 2: loss up to 3.4e-5
        # relative, grad norm 3.2e-4, final state (relative L2 of one item) model 5.3e-3, main 4.8e-3,
        # moments 1.1e-2 -- bf16 weights and Adam's per-element normalisation amplify any noise within
        # a few steps. Bounds ~4x that.
        ToleranceProfile(
            "default",
            "GPU reduction-order noise: loss rtol 1e-4, grad norm and num-zeros 2e-3, lr exact to 1e-12, "
            "final state within 2e-2 relative L2 per item (moments 5e-2)",
            1e-4, 0.0, 0.0, 1e-12, metrics_rtol=2e-3, state_rtol=2e-2, state_rtol_by_section=(("moments", 5e-2),),
        ),
        ToleranceProfile(
            "loose",
            "Megatron-LM functional test lane: loss within 5 % relative, max(1, n/100) steps may fail; lr within 1e-9",
            0.05,
            0.0,
            1e-9,
            0.0,
            0.01,
            state_rtol=5e-2,
        ),
        # The name a resume at another DP size is judged under (RunSpec.effective_tolerance); the
        # bounds it is judged by are calibrated per config and direction (calibrated_reshard_profile),
        # these static ones apply only where a spec names `reshard` for a run at one DP size.
        # Another DP size reduces grads and the grad norm in another order (8e-8 relative at the first
        # resumed step); bf16 weights, Adam's small second moments and top-k routing amplify that.
        ToleranceProfile(
            "reshard",
            "resume at another DP size: bounds measured per config and direction by `parity calibrate` "
            "(jobs/calibration/reshard.json), a small factor above clean resumes' largest deltas",
            1e-3,
            0.0,
            0.0,
            1e-12,
            metrics_rtol=2e-2,
            state_rtol=1e-2,
        ),
    )
}
DEFAULT_TOLERANCE = "exact"


# --- calibrated reshard bounds ---------------------------------------------------------------------


def device_key(device: str, key: str) -> str:
    """A calibration key of one device kind: CPU keys as they always were, others prefixed (`cuda/...`)."""
    return key if device == "cpu" else f"{device}/{key}"


def reshard_key(config: str, dp: int, resume_dp: int, resumed_steps: int | None = None, device: str = "cpu",
                change: str | None = None) -> str:
    """The calibration entry of one config and direction, measured over `resumed_steps` (None: legacy key).

    `change` names a resume on another model-parallel layout (RunSpec.layout_change: `dp1tp2->dp2`); a
    DP-only reshard keeps its `dp->resume_dp` name."""
    base = device_key(device, f"{config}:{change or f'{dp}->{resume_dp}'}")
    return base if resumed_steps is None else f"{base}@{resumed_steps}"


def noise_key(config: str, dp: int, resumed_steps: int, device: str = "cuda") -> str:
    """The entry of a device's own noise: clean resumes at one layout (dp) of a config, over resumed_steps."""
    return device_key(device, f"{config}:dp{dp}@{resumed_steps}")


def _horizon(entry: dict[str, Any]) -> int:
    return int(entry["spec"]["steps"]) - int(entry["spec"]["save_step"])


def load_calibration(path: Path = CALIBRATION_FILE) -> dict[str, Any]:
    """The calibration file ({"entries": {key: entry}}), or an empty one."""
    if not path.exists():
        return {"entries": {}}
    return dict(json.loads(path.read_text()))


def bounds_from(observed: dict[str, Any], factor: float = CALIBRATION_FACTOR) -> dict[str, Any]:
    """The bounds a measurement supports: factor x observed, at least the floor (lr: exact to 1e-12)."""

    def b(x: float) -> float:
        return float(f"{max(factor * x, CALIBRATION_FLOOR):.3g}")

    return {
        "loss_rtol": b(observed["loss_rel"]),
        "metrics_rtol": b(max(observed["grad_norm_rel"], observed["num_zeros_rel"])),
        "lr_atol": max(1e-12, factor * observed["lr_abs"]),
        "state_rtol": {s: b(observed["state"][s]) for s in NUMERIC_STATE_SECTIONS},
    }


def calibrated_reshard_profile(
    config: str, dp: int, resume_dp: int, resumed_steps: int, calibration: dict[str, Any] | None = None,
    device: str = "cpu", training: str | None = None, change: str | None = None, calibrate_flags: str = "",
) -> tuple[ToleranceProfile | None, str]:
    """(the measured profile for this reshard, or None; why not / where it comes from).

    A cuda reshard is judged only by bounds measured on a GPU (GPU_CALIBRATION_FILE), never by the CPU's.
    With `training` (ModelConfig.training), only bounds measured on that training count: a bound measured
    before the config's training changed (another field, default or engine revision) says nothing of it.
    """
    key = reshard_key(config, dp, resume_dp, device=device, change=change)
    flags = calibrate_flags or f"--dp {dp} --resume-dp {resume_dp}"  # what `parity calibrate` takes for it
    if calibration is None:
        calibration = load_calibration(CALIBRATION_FILE if device == "cpu" else GPU_CALIBRATION_FILE)
    entries = calibration["entries"]
    # one entry per horizon: drift grows with every resumed step, so a bound is used only up to the number of
    # resumed steps it was measured over, and the nearest horizon that covers the run is the tightest
    measured = {k: e for k, e in entries.items() if k == key or k.startswith(f"{key}@")}
    stale = {k: e for k, e in measured.items() if training is not None and e.get("training") != training}
    measured = {k: e for k, e in measured.items() if k not in stale}
    if not measured:
        if stale:
            was = sorted({str(e.get("training", "r1 (the toy engine)")) for e in stale.values()})
            return None, (f"the reshard bound for {key} was measured on another training ({', '.join(was)}); "
                          f"{config} now trains as {training}: re-measure it with `parity calibrate --config "
                          f"{config} {flags} --write` (jobs/calibration/reshard.json)")
        return None, (f"no measured reshard bound for {key}: run `parity calibrate --config {config} "
                      f"{flags}` (jobs/calibration/reshard.json)")
    covering = sorted((e for e in measured.values() if _horizon(e) >= resumed_steps), key=_horizon)
    if not covering:
        horizons = ", ".join(str(h) for h in sorted({_horizon(e) for e in measured.values()}))
        return None, (f"the reshard bound for {key} was measured over {horizons} resumed steps, "
                      f"this run resumes {resumed_steps}: calibrate that horizon with `parity calibrate "
                      f"--config {config} {flags} --steps <M> --save-step <N> --write` "
                      f"(M - N >= {resumed_steps})")
    entry = covering[0]
    key = next(k for k, e in measured.items() if e is entry)
    bound = entry["bound"]
    source = (f"calibrated {key}, {entry['factor']:g}x the largest of {entry['runs']} clean runs, "
              f"megatron-core {entry['build'].get('megatron_core', '?')}")
    profile = replace(
        TOLERANCE_PROFILES["reshard"],
        name=f"reshard:{key}",
        description=source,
        loss_rtol=bound["loss_rtol"],
        metrics_rtol=bound["metrics_rtol"],
        lr_atol=bound["lr_atol"],
        state_rtol=max(bound["state_rtol"].values()),
        state_rtol_by_section=tuple(sorted(bound["state_rtol"].items())),
        source=source,
    )
    return profile, source


# --- calibrated GPU noise (a cuda check at one layout, `default`) ------------------------------------


def calibrated_noise_profile(
    config: str, dp: int, resumed_steps: int, device: str = "cuda", calibration: dict[str, Any] | None = None
) -> tuple[ToleranceProfile, str]:
    """(the profile a `default` check on `device` is judged by; where its bounds come from).

    The bounds measured for this config, layout and device over at least `resumed_steps` when there
    are some (GPU_CALIBRATION_FILE, written from benchmarks/gpu_gate.py's repeated clean runs); else the
    static `default`, whose bounds come from a CPU simulation of GPU noise, and the source says so.
    """
    static = TOLERANCE_PROFILES["default"]
    entries = (calibration if calibration is not None else load_calibration(GPU_CALIBRATION_FILE))["entries"]
    base = noise_key(config, dp, 0, device).rsplit("@", 1)[0]
    covering = sorted((e for k, e in entries.items() if k.startswith(f"{base}@") and _horizon(e) >= resumed_steps),
                      key=_horizon)
    if not covering:
        why = (f"no {device} noise measured for {base}: the static default (CPU-simulated GPU noise); "
               "benchmarks/gpu_gate.py measures it")
        return replace(static, source=why), why
    entry = covering[0]
    bound = entry["bound"]
    source = (f"calibrated {base}@{_horizon(entry)} on {entry['build'].get('device_name', device)}, "
              f"{entry['factor']:g}x the largest of {entry['runs']} clean runs")
    return replace(
        static, name=f"default:{base}", description=source, loss_rtol=bound["loss_rtol"],
        metrics_rtol=bound["metrics_rtol"], lr_atol=bound["lr_atol"], state_rtol=max(bound["state_rtol"].values()),
        state_rtol_by_section=tuple(sorted(bound["state_rtol"].items())), source=source,
    ), source
