"""Turn the probes in two phase documents into evidence keyed by signature name (pure)."""

from __future__ import annotations

from typing import Any

from jobs.contract import (
    BUCKETS,
    FINGERPRINTS,
    INDEX_MAP,
    INDEX_MAP_EFFECTIVE,
    PARAM_GROUPS,
    FindingProbe,
    PhaseDocument,
    PhaseName,
    PhaseProbes,
    ProbeFindingRow,
)
from jobs.spec import RunSpec

MAX_ITEMS = 12


def fingerprint_diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """List (param, key) entries whose fingerprints differ; a missing param counts as differing."""
    out = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            out.append({"param": name, "key": "*", "before": a is not None, "after": b is not None})
            continue
        for key in sorted(set(a) | set(b)):
            va, vb = a.get(key), b.get(key)
            same = va == vb if key == "step" else (va or {}).get("sha1") == (vb or {}).get("sha1")
            if not same:
                out.append({"param": name, "key": key, "before": _short(va), "after": _short(vb)})
    return out


def _short(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: v[k] for k in ("numel", "sum", "abs_sum") if k in v}
    return v


def _probes(doc: PhaseDocument | None) -> PhaseProbes:
    return (doc.get("probes") or {}) if doc else {}


def index_map_findings(doc: PhaseDocument | None) -> tuple[dict[str, Any] | None, bool]:
    """Return (evidence of an effective misalignment or None, whether a raw one was worked around)."""
    probes = _probes(doc)
    raw = probes.get(INDEX_MAP)
    if not raw:
        return None, False
    effective = probes.get(INDEX_MAP_EFFECTIVE) or raw
    worked_around = raw["misaligned_total"] > 0 and effective["misaligned_total"] == 0
    if effective["misaligned_total"] == 0:
        return None, worked_around
    per_rank = [
        {
            "rank": r,
            "optimizer": o["optimizer"],
            "entries": o["entries"],
            "misaligned_count": o["misaligned_count"],
            "group_dtype_order": o.get("group_dtype_order"),
            "misaligned": o["misaligned"][:MAX_ITEMS],
        }
        for r, rank_report in enumerate(effective["per_rank"])
        for o in rank_report["optimizers"]
        if o["misaligned_count"]
    ]
    return {"misaligned_total": effective["misaligned_total"], "per_rank": per_rank}, False


def _per_rank_diffs(before: list[Any] | None, after: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for rank, (a, b) in enumerate(zip(before or [], after or [], strict=False)):
        if not a or not b:
            continue
        for d in fingerprint_diff(a, b):
            out.append({"rank": rank, **d})
    return out


def collect_evidence(
    spec: RunSpec, baseline: PhaseDocument | None, resumed: PhaseDocument | None, lane: dict[str, Any]
) -> dict[str, Any]:
    """Return {signature name: evidence} for every signature the probes support."""
    ev: dict[str, Any] = {}
    misaligned, worked_around = index_map_findings(baseline)
    if misaligned is None and baseline is None:
        misaligned, worked_around = index_map_findings(resumed)
    if misaligned:
        ev["optimizer-index-misalignment"] = misaligned
    at_save: dict[str, Any] = dict(_probes(baseline).get(FINGERPRINTS["at_save"]) or {})
    after_load: dict[str, Any] = dict(_probes(resumed).get(FINGERPRINTS["after_load"]) or {})
    slot_diffs = _per_rank_diffs(at_save.get("owned"), at_save.get("slots"))
    restore_diffs = _per_rank_diffs(at_save.get("owned"), after_load.get("owned"))
    state_diffs = [d for d in restore_diffs if d["key"] != "step"]
    if slot_diffs or state_diffs:
        ev["optimizer-state-mismatch"] = {
            "checkpoint_slot_differs_from_owner": {"count": len(slot_diffs), "items": slot_diffs[:MAX_ITEMS]},
            "after_load_differs_from_save": {"count": len(state_diffs), "items": state_diffs[:MAX_ITEMS]},
        }
    step_diffs = [d for d in restore_diffs if d["key"] == "step"]
    if step_diffs:
        info = resumed["info"] if resumed else {}
        ev["adam-step-not-restored"] = {
            "step": spec.save_step + 1,
            "checkpoint_step": info.get("checkpoint_adam_step"),
            "adam_steps_after_load": info.get("adam_steps_after_load"),
            "params_affected": len(step_diffs),
            "items": step_diffs[:3],
        }
    if lane["lr_mismatched_steps"]:
        ev["lr-schedule-mismatch"] = {
            "steps": lane["lr_mismatched_steps"][:MAX_ITEMS],
            "first_step": lane["lr_mismatched_steps"][0],
        }
    groups = _probes(resumed).get(PARAM_GROUPS["after_load"])
    if groups and not groups["agree"]:
        ev["layerwise-metadata-mismatch"] = {
            "disagreements": groups["disagreements"][:MAX_ITEMS],
            "empty_rank_groups": groups["empty_rank_groups"],
        }
    buckets = _probes(baseline).get(BUCKETS) or _probes(resumed).get(BUCKETS)
    if buckets and buckets["unaligned_total"]:
        issues = [
            {"rank": r, "buffer": b["buffer"], **i}
            for r, rep in enumerate(buckets["per_rank"])
            for b in rep["buffers"]
            for i in b["issues"]
        ]
        ev["bucket-offset-unaligned"] = {"count": len(issues), "items": issues[:MAX_ITEMS]}
    if worked_around:
        ev["_worked_around"] = ["optimizer-index-misalignment"]
    return ev


MAX_FINDINGS = 200


def _finding(
    phase: PhaseName, probe: FindingProbe, ok: bool, param_name: str | None = None, **detail: Any
) -> ProbeFindingRow:
    return {"phase": phase, "probe": probe, "ok": ok, "param_name": param_name, "detail": detail}


def probe_findings(baseline: PhaseDocument | None, resumed: PhaseDocument | None) -> list[ProbeFindingRow]:
    """Flatten both documents' probes into rows: one per probe, plus one per implicated param."""
    rows: list[ProbeFindingRow] = []
    at_save: dict[str, Any] = dict(_probes(baseline).get(FINGERPRINTS["at_save"]) or {})
    phases: tuple[tuple[PhaseName, PhaseDocument | None], ...] = (("train_and_save", baseline), ("resume", resumed))
    for phase, doc in phases:
        probes = _probes(doc)
        imap = probes.get(INDEX_MAP_EFFECTIVE) or probes.get(INDEX_MAP)
        if imap and imap["applicable"]:
            raw = probes.get(INDEX_MAP) or imap
            rows.append(
                _finding(
                    phase,
                    "index_map",
                    imap["misaligned_total"] == 0,
                    misaligned_total=imap["misaligned_total"],
                    raw_misaligned_total=raw["misaligned_total"],
                )
            )
            for rank, rep in enumerate(imap["per_rank"]):
                for o in rep["optimizers"]:
                    rows += [_finding(phase, "index_map", False, m["param"], rank=rank, **m) for m in o["misaligned"]]
        buckets = probes.get(BUCKETS)
        if buckets and buckets["applicable"]:
            rows.append(
                _finding(
                    phase,
                    "bucket_offsets",
                    buckets["unaligned_total"] == 0,
                    unaligned_total=buckets["unaligned_total"],
                )
            )
            for rank, rep in enumerate(buckets["per_rank"]):
                for b in rep["buffers"]:
                    rows += [
                        _finding(phase, "bucket_offsets", False, i["param"], rank=rank, buffer=b["buffer"], **i)
                        for i in b["issues"]
                    ]
        groups = probes.get(PARAM_GROUPS["after_load"]) or probes.get(PARAM_GROUPS["at_save"])
        if groups:
            rows.append(
                _finding(
                    phase,
                    "param_group_agreement",
                    groups["agree"],
                    disagreements=groups["disagreements"],
                    empty_rank_groups=groups["empty_rank_groups"],
                )
            )
    if at_save.get("slots"):
        diffs = _per_rank_diffs(at_save.get("owned"), at_save.get("slots"))
        rows.append(_finding("train_and_save", "checkpoint_slot_fingerprints", not diffs, differing=len(diffs)))
        rows += [_finding("train_and_save", "checkpoint_slot_fingerprints", False, d["param"], **d) for d in diffs]
    after: dict[str, Any] = dict(_probes(resumed).get(FINGERPRINTS["after_load"]) or {})
    if at_save.get("owned") and after.get("owned"):
        diffs = _per_rank_diffs(at_save.get("owned"), after.get("owned"))
        rows.append(_finding("resume", "restored_state_fingerprints", not diffs, differing=len(diffs)))
        rows += [_finding("resume", "restored_state_fingerprints", False, d["param"], **d) for d in diffs]
    return rows[:MAX_FINDINGS]
