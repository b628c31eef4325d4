"""Tolerance that means what it says (pure): every profile bounds every lane and the final state,
reshard runs are judged by measured bounds, state probes are required, a probe that cannot run says so."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from jobs.configs import CONFIGS
from jobs.contract import required_probes
from jobs.spec import RunSpec
from jobs.tolerance import (
    NUMERIC_STATE_SECTIONS,
    TOLERANCE_PROFILES,
    bounds_from,
    calibrated_reshard_profile,
    load_calibration,
)
from jobs.verdict import final_state
from jobs.verdict.compare import evaluate
from jobs.verdict.profile import judged_profile
from tests.plugins.synthetic_documents import baseline, resumed

SNAP = {
    "model": {"w": "bfloat16[4]:aa"},
    "main": {"w": "float32[4]:bb"},
    "moments": {"w/exp_avg": "float32[4]:cc"},
    "steps": {"w": "6.0"},
    "groups": {"o0.g0.lr": "0.001"},
    "scheduler": {"num_steps": "6"},
    "iteration": {"iteration": "6"},
}


def _deltas(rel: float, sections: tuple[str, ...] = NUMERIC_STATE_SECTIONS) -> dict[str, Any]:
    return {"view": "per-rank", "ranks": 1, "sections": {
        s: {"max_rel": rel if s in sections else 0.0, "max_abs": rel, "worst": "w", "differing": 1, "items": 1}
        for s in NUMERIC_STATE_SECTIONS}}


def _docs(final_res: dict[str, Any], deltas: dict[str, Any] | None) -> tuple[Any, Any]:
    base = baseline(probes={"state_final": [SNAP]})
    res = resumed(probes={"state_final": [final_res]})
    if deltas is None:
        del res["probes"]["state_final_deltas"]
    else:
        res["probes"]["state_final_deltas"] = deltas  # type: ignore[typeddict-item]
    return base, res


def _moved(**sections: dict[str, str]) -> dict[str, Any]:
    snap = copy.deepcopy(SNAP)
    for s, items in sections.items():
        snap[s].update(items)
    return snap


@pytest.mark.parametrize("name", sorted(TOLERANCE_PROFILES))
def test_every_profile_bounds_every_lane_and_the_final_state(name: str) -> None:
    p = TOLERANCE_PROFILES[name]
    state = [p.state_bound(s) for s in NUMERIC_STATE_SECTIONS]
    bounds = [p.loss_rtol, p.lr_rtol + p.lr_atol, p.metrics_bound(), *state]
    assert all(isinstance(b, float) and math.isfinite(b) for b in bounds)
    if name == "exact":
        assert p.exact and not any(bounds)
    else:  # a finite, non-zero bound on each lane and each numeric section
        assert not p.exact and all(b > 0 for b in bounds[:1] + bounds[2:])


def test_exact_flags_any_final_state_difference_even_the_tiniest() -> None:
    base, res = _docs(_moved(main={"w": "float32[4]:b2"}), _deltas(1e-12, ("main",)))
    assert final_state.findings(TOLERANCE_PROFILES["exact"], base, res)
    r = evaluate({"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3}, base, res)
    assert r["verdict"] == "fail" and r["signatures"] == ["final-state-mismatch"] and r["verdict_label"] == "fail"


def test_default_passes_drift_within_its_state_bound_and_fails_beyond_it() -> None:
    spec = {"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3, "tolerance": "default"}
    moved = _moved(model={"w": "bfloat16[4]:a2"}, main={"w": "float32[4]:b2"}, moments={"w/exp_avg": "float32[4]:c2"})
    within = evaluate(spec, *_docs(moved, _deltas(1e-3)))
    assert within["verdict"] == "pass", within["evidence"]
    assert within["lanes"]["final_state"]["pass"] and within["verdict_label"].startswith("pass [default: ")
    beyond = evaluate(spec, *_docs(moved, _deltas(0.5, ("main",))))
    assert beyond["verdict"] == "fail" and beyond["signatures"] == ["final-state-mismatch"]
    ev = beyond["evidence"]["final-state-mismatch"]
    assert ev["profile"] == "default" and set(ev["beyond_bound"]) == {"main"}
    assert ev["beyond_bound"]["main"]["bound"] == TOLERANCE_PROFILES["default"].state_bound("main")


def test_no_tolerance_covers_discrete_sections_replica_drift_or_unmeasured_numbers() -> None:
    default = TOLERANCE_PROFILES["loose"]
    assert "final-state-mismatch" in final_state.findings(default, *_docs(_moved(steps={"w": "5.0"}), _deltas(0.0)))
    differ = _moved(model={"w": "ranks-differ(r0=bfloat16[4]:aa, r1=bfloat16[4]:a2)"})
    ev = final_state.findings(default, *_docs(differ, _deltas(0.0)))["final-state-mismatch"]
    assert ev["differing_exactly"] == ["model"]
    unmeasured = final_state.findings(default, *_docs(_moved(main={"w": "float32[4]:b2"}), None))
    assert unmeasured["final-state-mismatch"]["beyond_bound"]["main"]["max_rel"] is None


CALIBRATION = {"entries": {"dense-bf16:2->1": {
    "spec": {"config": "dense-bf16", "dp": 2, "resume_dp": 1, "steps": 6, "save_step": 3},
    "training": CONFIGS["dense-bf16"].training,  # measured on the config as it trains now
    "runs": 3, "factor": 4.0, "build": {"megatron_core": "0.16.1"},
    "bound": bounds_from({"loss_rel": 2e-6, "grad_norm_rel": 1e-5, "num_zeros_rel": 0.0, "lr_abs": 0.0,
                          "state": {"model": 1e-3, "main": 2e-3, "moments": 1e-2}}),
}}}


def test_a_reshard_is_judged_by_the_bound_measured_for_its_config_and_direction() -> None:
    spec = RunSpec.from_dict({"config": "dense-bf16", "dp": 2, "resume_dp": 1, "steps": 6, "save_step": 3})
    profile, err = judged_profile(spec, CALIBRATION)
    assert err is None and profile.name == "reshard:dense-bf16:2->1"
    assert (profile.loss_rtol, profile.metrics_rtol, profile.state_bound("main")) == (8e-6, 4e-5, 8e-3)
    assert "calibrated dense-bf16:2->1, 4x the largest of 3 clean runs" in profile.bound_label()
    # another direction, or more resumed steps than were measured: not judged
    other = RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "resume_dp": 2, "steps": 6, "save_step": 3})
    assert judged_profile(other, CALIBRATION)[1]["type"] == "NotCalibrated"  # type: ignore[index]
    assert calibrated_reshard_profile("dense-bf16", 2, 1, 5, CALIBRATION)[0] is None
    assert calibrated_reshard_profile("dense-bf16", 2, 1, 2, CALIBRATION)[0] is not None


def test_a_bound_measured_before_the_config_trained_as_it_does_now_judges_nothing() -> None:
    """A bound measured on another training (the toy engine's, before a default changed) says nothing of
    today's deltas: the run is NotCalibrated, named so, and the message gives the command that re-measures."""
    stale = {"entries": {k: {**e, "training": "r1-0123456789"} for k, e in CALIBRATION["entries"].items()}}
    entries = CALIBRATION["entries"]
    legacy = {"entries": {k: {x: v for x, v in e.items() if x != "training"} for k, e in entries.items()}}
    spec = RunSpec.from_dict({"config": "dense-bf16", "dp": 2, "resume_dp": 1, "steps": 6, "save_step": 3})
    for calibration in (stale, legacy):
        profile, err = judged_profile(spec, calibration)
        assert err is not None and err["type"] == "NotCalibrated"
        assert "measured on another training" in err["message"] and spec.training in err["message"]
        assert "parity calibrate --config dense-bf16 --dp 2 --resume-dp 1 --write" in err["message"]
    assert judged_profile(spec, CALIBRATION)[1] is None  # the same entry on today's training: judged


def test_a_longer_horizon_is_judged_by_the_nearest_entry_measured_over_at_least_as_many_steps() -> None:
    entries: dict[str, Any] = dict(CALIBRATION["entries"])
    legacy: dict[str, Any] = entries["dense-bf16:2->1"]
    longer = {**legacy, "spec": {**legacy["spec"], "steps": 12, "save_step": 4},
              "bound": bounds_from({"loss_rel": 2e-5, "grad_norm_rel": 1e-4, "num_zeros_rel": 0.0, "lr_abs": 0.0,
                                    "state": {"model": 5e-3, "main": 6e-3, "moments": 2e-2}})}
    calibration = {"entries": {**entries, "dense-bf16:2->1@8": longer}}
    # 3 resumed steps: the tighter legacy entry; 4 to 8: the one measured over 8; 9: none covers it
    three, _ = calibrated_reshard_profile("dense-bf16", 2, 1, 3, calibration)
    assert three is not None and three.name == "reshard:dense-bf16:2->1"
    four, _ = calibrated_reshard_profile("dense-bf16", 2, 1, 4, calibration)
    assert four is not None and four.name == "reshard:dense-bf16:2->1@8" and four.loss_rtol == 8e-5
    none, why = calibrated_reshard_profile("dense-bf16", 2, 1, 9, calibration)
    assert none is None and "measured over 3, 8 resumed steps" in why and "--steps <M>" in why


def test_an_uncalibrated_reshard_is_an_error_not_a_pass() -> None:
    spec = {"config": "dense-bf16", "dp": 2, "resume_dp": 1, "steps": 6, "save_step": 3}
    if any(k.startswith("dense-bf16:2->1") for k in load_calibration()["entries"]):
        spec["config"] = "equal-shards-fp32-head"  # a config nobody calibrated
    r = evaluate(spec, baseline(), resumed())
    assert r["verdict"] == "error" and [e["type"] for e in r["errors"]] == ["NotCalibrated"]
    assert "parity calibrate --config" in r["errors"][0]["message"]
    # a phase that crashed is judged by its crash, calibrated or not
    crashed = resumed()
    crashed["status"] = "error"
    crashed["error"] = {"type": "RuntimeError", "message": "boom", "traceback": "", "stage": "load", "rank": 0}
    assert [e["type"] for e in evaluate(spec, baseline(), crashed)["errors"]] == ["RuntimeError"]


def test_current_schema_documents_without_state_probes_are_errors_older_ones_are_not() -> None:
    spec = {"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3}
    assert "state_final_deltas" in required_probes("resume", [])
    assert "state_at_save" in required_probes("train_and_save", [], "save")
    assert "state_after_save" not in required_probes("train_and_save", [], "save")
    assert "state_at_save" not in required_probes("train_and_save", [], schema_version=2)
    base, res = baseline(), resumed()
    del base["probes"]["state_at_save"]
    r = evaluate(spec, base, res)
    assert r["verdict"] == "error" and any("probes.state_at_save" in e["message"] for e in r["errors"])
    for doc in (base, res):  # the same documents from before the snapshots existed: judged without them
        doc["schema_version"] = 2
        for key in ("state_after_save", "state_final", "state_after_load_raw", "state_final_deltas",
                    "param_groups_after_optimizer_load"):
            doc["probes"].pop(key, None)  # type: ignore[misc]
    assert evaluate(spec, base, res)["verdict"] == "pass"


def test_a_probe_that_could_not_run_is_an_advisory_not_a_silent_zero() -> None:
    spec = {"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3}
    reason = "not applicable on this build: AttributeError: 'X' object has no attribute 'param_to_index'"
    base = baseline(probes={"buckets": {"applicable": False, "unaligned_total": 0, "per_rank": [], "reason": reason}})
    r = evaluate(spec, base, resumed())
    assert r["verdict"] == "pass" and r["advisories"] == ["probe-not-applicable"]
    assert r["evidence"]["probe-not-applicable"] == {"probes": {"train_and_save.buckets": reason}}
    assert evaluate(spec, baseline(), resumed())["advisories"] == []


def test_calibrate_names_the_field_of_an_invalid_spec_and_exits_2(capsys, tmp_path: Path) -> None:
    from jobs.launch import calibrate

    code = calibrate.main(["--config", "gpt-recipe", "--dp", "1", "--resume-dp", "1", "--run-folder", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "invalid spec: resume_dp: equals dp (1)" in err and "Traceback" not in err
