"""Synthetic phase documents for the pure comparison tests (no Megatron): a clean baseline and resume
of a small dense run, with every probe a finished phase carries; a test overrides what it exercises."""

from __future__ import annotations

from typing import Any, cast

from jobs.contract import PhaseDocument, PhaseName, phase_document, required_probes

SPEC = {"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3}
LOSS = {1: 7.0, 2: 6.9, 3: 6.8, 4: 6.7, 5: 6.6, 6: 6.5}
LR = {1: 0.0, 2: 3e-4, 3: 6e-4, 4: 1e-3, 5: 8e-4, 6: 3e-4}


def fingerprint(value: float) -> dict[str, Any]:
    return {"numel": 4, "sum": value, "abs_sum": abs(value), "sha1": f"h{value}"}


def optimizer_state(step: float = 3.0, avg: float = 1.0) -> dict[str, Any]:
    return {"w": {"param": fingerprint(0.5), "exp_avg": fingerprint(avg), "exp_avg_sq": fingerprint(2.0), "step": step}}


# Probes every finished phase carries (required_probes); a test's own probes replace these by key.
CLEAN = {
    "index_map": {
        "applicable": True, "misaligned_total": 0,
        "per_rank": [{"applicable": True, "misaligned_total": 0, "optimizers": []}],
    },
    "buckets": {"applicable": True, "unaligned_total": 0, "per_rank": [{"buffers": []}]},
    "param_groups_at_save": {"agree": True, "disagreements": [], "empty_rank_groups": [], "per_rank": [[]]},
    "param_groups_after_load": {"agree": True, "disagreements": [], "empty_rank_groups": [], "per_rank": [[]]},
    # state snapshots with no sections: these tests exercise the optimizer fingerprints instead
    # (the snapshot diff has its own tests in test_state_diff.py)
    "state_at_save": [{}],
    "state_after_save": [{}],
    "state_after_load_raw": [{}],
    "param_groups_after_optimizer_load": [{}],
    "state_final": [{}],
    "state_final_deltas": {"view": "per-rank", "ranks": 1, "sections": {
        s: {"max_rel": 0.0, "max_abs": 0.0, "worst": None, "differing": 0, "items": 1}
        for s in ("model", "main", "moments")}},
}


def document(
    phase: PhaseName, steps: range, probes: dict[str, Any], loss: dict | None = None, lr: dict | None = None,
    **extra: Any,
) -> PhaseDocument:
    loss, lr = loss or LOSS, lr or LR
    doc = phase_document(SPEC, phase, 0, status="ok")
    doc["steps"] = [
        {"step": s, "loss": loss[s], "lr": lr[s], "grad_norm": 1.0, "num_zeros": None, "update_successful": True,
         "wall_s": 0.1}
        for s in steps
    ]
    doc["probes"] = cast(Any, {k: v for k, v in CLEAN.items() if k in required_probes(phase, [])} | probes)
    return cast(PhaseDocument, {**doc, **extra})


def baseline(**kw: Any) -> PhaseDocument:
    probes = {"fingerprints_at_save": {"owned": [optimizer_state()], "slots": [optimizer_state()]}}
    return document("train_and_save", range(1, 7), probes | kw.pop("probes", {}), **kw)


def resumed(step: float = 3.0, **kw: Any) -> PhaseDocument:
    probes = {"fingerprints_after_load": {"owned": [optimizer_state(step)]}}
    return document("resume", range(4, 7), probes | kw.pop("probes", {}), **kw)
