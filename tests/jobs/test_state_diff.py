"""The complete state diff, workaround accounting, crash attribution and error de-duplication (pure)."""

from __future__ import annotations

import json
import math
from typing import Any

from jobs.contract import required_probes
from jobs.errors import dedupe_errors, with_rank_errors
from jobs.launch.local import format_step_table
from jobs.verdict.compare import evaluate
from jobs.verdict.state_diff import RESTORE_SIGNATURES, group_disagreements, groups_after_optimizer_load
from tests.plugins.synthetic_documents import CLEAN

SPEC = {"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3, "workarounds": ["restore-adam-step"]}
LOSS = {1: 7.0, 2: 6.9, 3: 6.8, 4: 6.7, 5: 6.6, 6: 6.5}
LR = {1: 0.0, 2: 3e-4, 3: 6e-4, 4: 1e-3, 5: 8e-4, 6: 3e-4}


def _snap(**changes: dict[str, str]) -> dict[str, Any]:
    snap = {
        "model": {"decoder.w": "bfloat16[4]:aa", "buffer:decoder.rope": "float32[2]:r0"},
        "main": {"decoder.w": "float32[4]:bb"},
        "moments": {"decoder.w/exp_avg": "float32[4]:cc", "decoder.w/exp_avg_sq": "float32[4]:dd"},
        "steps": {"decoder.w": "3.0"},
        "groups": {"o0.g0.lr": "0.001", "o0.g0.eps": "1e-08", "o0.g0.local_params": "1"},
        "scheduler": {"num_steps": "3"},
        "iteration": {"iteration": "3"},
        "rng": {"torch_cpu": "uint8[5056]:ee", "tracker/model-parallel-rng": "uint8[5056]:ff"},
    }
    for section, items in changes.items():
        snap[section] = {**snap[section], **items}
    return snap


def document(phase: str, steps: range, probes: dict[str, Any], **extra: Any) -> Any:
    rows = [
        {"step": s, "loss": LOSS[s], "lr": LR[s], "grad_norm": 1.5, "num_zeros": 0, "wall_s": 0.1} for s in steps
    ]
    fingerprints: dict[str, Any] = {"owned": [{}], "slots": [{}]}  # the optimizer fingerprints: nothing in them here
    clean = {**CLEAN, "fingerprints_at_save": fingerprints, "fingerprints_after_load": fingerprints}
    required = {k: v for k, v in clean.items() if k in required_probes(phase, ["restore-adam-step"])}
    doc = {"status": "ok", "phase": phase, "rank": 0, "spec": SPEC, "error": None, "info": {},
           "probes": {**required, **probes}}
    return {**doc, "steps": rows, **extra}


def _pair(saved: list | None = None, raw: list | None = None, after: list | None = None, **kw: Any) -> tuple:
    saved = saved or [_snap(), _snap()]
    base_probes = {"state_at_save": saved, "state_after_save": kw.pop("after_save", saved)}
    base_probes["state_final"] = kw.pop("final_base", [_snap(), _snap()])
    res_probes = {"state_after_load_raw": raw or saved, "state_final": kw.pop("final_res", [_snap(), _snap()])}
    if after is not None:
        res_probes["state_after_load"] = after
    res_probes.update(kw.pop("resume_probes", {}))
    baseline = document("train_and_save", range(1, 7), base_probes)
    resumed = document("resume", range(4, 7), res_probes, **kw)
    return baseline, resumed


def test_known_good_passes_silently() -> None:
    r = evaluate(SPEC, *_pair())
    assert r["verdict"] == "pass" and r["verdict_label"] == "pass" and r["signatures"] == []
    json.dumps(r)


def test_every_section_maps_to_its_signature_with_names() -> None:
    changes = {
        "model": {"decoder.w": "bfloat16[4]:XX"},
        "main": {"decoder.w": "float32[4]:XX"},
        "moments": {"decoder.w/exp_avg_sq": "float32[4]:XX"},
        "steps": {"decoder.w": "1.0"},
        "groups": {"o0.g0.eps": "1e-06"},
        "scheduler": {"num_steps": "2"},
        "iteration": {"iteration": "2"},
        "rng": {"tracker/model-parallel-rng": "uint8[5056]:XX"},
    }
    for section, items in changes.items():
        broken = [_snap(), _snap(**{section: items})]  # only rank 1 restored it wrongly
        r = evaluate(SPEC, *_pair(raw=broken, after=broken))
        sig = RESTORE_SIGNATURES[section]
        assert r["verdict"] == "fail" and sig in r["signatures"], (section, r["signatures"])
        ev = r["evidence"][sig]
        assert ev["ranks"] == [1] and ev["names"] == list(items), ev


def test_group_keys_only_added_by_the_load_are_not_a_difference() -> None:
    after = [_snap(groups={"o0.g0.step": "3.0"}), _snap(groups={"o0.g0.step": "3.0"})]
    assert evaluate(SPEC, *_pair(raw=after, after=after))["verdict"] == "pass"


def test_save_that_changes_the_live_state_is_flagged() -> None:
    r = evaluate(SPEC, *_pair(after_save=[_snap(main={"decoder.w": "float32[4]:RR"}), _snap()]))
    assert r["verdict"] == "fail" and r["signatures"] == ["save-mutates-live-state"]
    assert r["evidence"]["save-mutates-live-state"]["items"][0] == {
        "section": "main", "rank": 0, "name": "decoder.w", "before": "float32[4]:bb", "after": "float32[4]:RR"
    }


def test_final_state_mismatch_only_when_nothing_else_explains_it() -> None:
    final = [_snap(model={"decoder.w": "bfloat16[4]:ZZ"}), _snap()]
    r = evaluate(SPEC, *_pair(final_res=final))
    assert r["verdict"] == "fail" and r["signatures"] == ["final-state-mismatch"]
    broken = [_snap(moments={"decoder.w/exp_avg": "float32[4]:XX"}), _snap()]
    r = evaluate(SPEC, *_pair(raw=broken, after=broken, final_res=final))
    assert r["signatures"] == ["optimizer-moments-mismatch"]


def test_workaround_lists_what_it_hid() -> None:
    raw = [_snap(steps={"decoder.w": "1.0"}), _snap(steps={"decoder.w": "1.0"})]
    r = evaluate(SPEC, *_pair(raw=raw, after=[_snap(), _snap()]))
    assert r["verdict"] == "pass" and r["verdict_label"].startswith("pass (worked around: ")
    assert r["worked_around"] == ["adam-step-not-restored"]
    assert r["worked_around_by"] == {"restore-adam-step": ["adam-step-not-restored"]}
    assert r["worked_around_evidence"]["adam-step-not-restored"]["names"] == ["decoder.w"]
    table = format_step_table(r)
    assert "verdict: pass (worked around: " in table
    assert "passes only with workaround restore-adam-step, which hides adam-step-not-restored" in table
    view = {"would_raise": True, "params": ["head.0.weight"], "message": "a view of a leaf Variable ..."}
    spec = {**SPEC, "workarounds": ["load-no-grad"]}
    r = evaluate(spec, *_pair(resume_probes={"fp32_view_inplace": [view, {"would_raise": False}]}))
    assert r["verdict_label"].startswith("pass (worked around: ")
    assert r["worked_around_by"] == {"load-no-grad": ["fp32-view-inplace-load"]}
    assert r["worked_around_evidence"]["fp32-view-inplace-load"]["ranks"] == [0]


def test_bug_c_probe_fires_on_disagreeing_ranks() -> None:
    saved = [_snap(), _snap()]
    agree = [_snap()["groups"], _snap()["groups"]]
    assert groups_after_optimizer_load(saved, agree) == {}
    # rank 1 took rank 0's broken common metadata: its lr differs from rank 0's and from what it saved
    skewed = [_snap()["groups"], {**_snap()["groups"], "o0.g0.lr": "0.0", "o0.g0.local_params": "0"}]
    ev = groups_after_optimizer_load(saved, skewed)
    assert ev["layerwise-metadata-mismatch"]["disagreements"] == [
        {"key": "o0.g0.lr", "values": {"0": "0.001", "1": "0.0"}}
    ]
    assert ev["param-group-scalars-mismatch"]["ranks"] == [1]
    assert group_disagreements([{"o0.g1.local_params": "0"}, {"o0.g1.local_params": "1"}]) == []  # a rank's share
    r = evaluate(SPEC, *_pair(resume_probes={"param_groups_after_optimizer_load": skewed}))
    assert r["verdict"] == "fail"
    assert {"layerwise-metadata-mismatch", "param-group-scalars-mismatch"} <= set(r["signatures"])


def test_grad_norm_and_num_zeros_are_compared_and_nan_equals_nan() -> None:
    base, res = _pair()
    res["steps"][1]["num_zeros"] = 7
    r = evaluate(SPEC, base, res)
    assert r["verdict"] == "fail" and r["first_divergent_step"] == 5
    assert r["evidence"]["loss-divergence-unexplained"]["metrics"] == ["num_zeros"]
    base, res = _pair()
    for doc in (base, res):
        doc["steps"][-1]["loss"] = math.nan
    r = evaluate(SPEC, base, res)
    assert r["verdict"] == "pass" and r["steps"][-1]["loss_abs_delta"] == 0.0


def test_crash_with_measured_evidence_is_fail() -> None:
    broken = [_snap(main={"decoder.w": "float32[4]:XX"}), _snap()]
    crash = {"type": "RuntimeError", "message": "boom", "stage": "train", "traceback": "", "rank": 0}
    base, res = _pair(raw=broken, after=broken, status="error", error=crash)
    r = evaluate(SPEC, base, res)
    assert r["verdict"] == "fail" and "main-params-mismatch" in r["signatures"]


def test_unsupported_option_is_error_and_never_bug_a() -> None:
    misaligned = {
        "applicable": True,
        "misaligned_total": 3,
        "per_rank": [{"optimizers": [{"optimizer": 0, "entries": 5, "misaligned_count": 3, "misaligned": []}]}],
    }
    err = {
        "type": "NotImplementedError",
        "message": "Unknown sharding_type: dp_reshardable",
        "stage": "save",
        "traceback": "File distrib_optimizer.py ... NotImplementedError: Unknown sharding_type: dp_reshardable",
    }
    base = document("train_and_save", range(1, 4), {"index_map": misaligned}, status="error", error=err)
    r = evaluate(SPEC, base, None)
    assert r["verdict"] == "error" and r["signatures"][0] == "unsupported-by-build"
    assert "optimizer-index-misalignment" not in r["signatures"]
    assert "optimizer-index-misalignment" in r["advisories"]


def test_rank_errors_are_one_record_per_distinct_error() -> None:
    tb = "Traceback ...\n" * 200
    same: list[Any] = [
        {"type": "AssertionError", "message": "m", "stage": "save", "traceback": tb, "rank": r} for r in (0, 1)
    ]
    nested: Any = {**same[0], "all_ranks": same, "rank_errors": same}
    merged = dedupe_errors([nested, same[1]])
    assert len(merged) == 1 and merged[0]["ranks"] == [0, 1] and "all_ranks" not in merged[0]
    other: Any = {"type": "StageTimeout", "message": "t", "stage": "save", "traceback": "", "rank": 1}
    root = with_rank_errors(same[0], [*same, other])
    assert root["ranks"] == [0, 1] and root["traceback"] == tb
    assert [(e["type"], e["ranks"]) for e in root["rank_errors"]] == [("AssertionError", [0, 1]), ("StageTimeout", [1])]
    assert all(e["traceback"] == "" for e in root["rank_errors"])
    assert len(json.dumps(root)) < len(tb) + 800
