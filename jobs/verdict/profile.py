"""Which tolerance profile a run is judged by, and what a resharded run's result records about it (pure)."""

from __future__ import annotations

from typing import Any

from jobs.contract import ErrorRecord, error_record
from jobs.spec import RESHARD_TOLERANCE, RunSpec
from jobs.tolerance import TOLERANCE_PROFILES, ToleranceProfile, calibrated_noise_profile, calibrated_reshard_profile


def judged_profile(
    spec: RunSpec, calibration: dict[str, Any] | None = None
) -> tuple[ToleranceProfile, ErrorRecord | None]:
    """(the profile, an error when the run cannot be judged by one).

    A resume at another DP size left at `reshard` is judged by the bounds measured for its config
    and direction; with no such measurement it is not judged at all (`NotCalibrated`), since a
    guessed band is what let training-path bugs through before.
    """
    name = spec.effective_tolerance
    if spec.device != "cpu" and name == "default" and not spec.reshards:
        # a GPU's own noise, measured per device kind (jobs/calibration/gpu.json), never the CPU's simulation
        noise, _ = calibrated_noise_profile(spec.config, spec.dp, len(spec.resumed_steps), spec.device, calibration)
        return noise, None
    if not (spec.reshards and name == RESHARD_TOLERANCE):
        return TOLERANCE_PROFILES[name], None
    profile, why = calibrated_reshard_profile(
        spec.config, spec.dp, spec.phase_dp("resume"), len(spec.resumed_steps), calibration, device=spec.device,
        training=spec.training, change=spec.layout_change if spec.layout_free_view else None,
        calibrate_flags=calibrate_flags(spec),
    )
    if profile is None:
        return TOLERANCE_PROFILES[name], error_record("NotCalibrated", why, stage="evaluate")
    return profile, None


def calibrate_flags(spec: RunSpec) -> str:
    """The layout flags `parity calibrate` measures this reshard with."""
    flags = [f"--dp {spec.dp}"]
    flags += [f"--{k} {v}" for k, v in (("tp", spec.tp), ("pp", spec.pp), ("ep", spec.ep)) if v > 1]
    resumed = ("resume_dp", "resume_tp", "resume_pp", "resume_ep")
    flags += [f"--{k.replace('_', '-')} {getattr(spec, k)}" for k in resumed if getattr(spec, k) is not None]
    if spec.reshards_model:
        flags.append(f"--sharding {spec.sharding}")
    return " ".join(flags)


def reshard_fields(spec: RunSpec, profile: ToleranceProfile, final_lane: dict[str, Any]) -> dict[str, Any]:
    """`reshard`: what a resume at another DP size ran with and was judged by (nothing at one DP size)."""
    if not spec.reshards:
        return {}
    return {
        "reshard": {
            "dp": spec.dp,
            "resume_dp": spec.resume_dp,
            "layouts": {p: spec.layout(p).name for p in ("train_and_save", "resume")},
            "global_microbatches": spec.global_microbatches,
            "microbatches_per_rank": {p: spec.microbatches(p) for p in ("train_and_save", "resume")},
            "tolerance": profile.name,
            "bound": profile.to_dict(),
            "isolation": spec.effective_isolation,
            "isolation_requested": spec.isolation,
            "state_view": "global",
            "final_state": final_lane,
        }
    }
