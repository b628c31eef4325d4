"""Turn the probes in two phase documents into evidence keyed by signature name (pure)."""

from __future__ import annotations

from typing import Any

from jobs.contract import (
    BUCKETS,
    FINGERPRINTS,
    FP32_VIEW_INPLACE,
    GROUPS_AFTER_OPTIMIZER_LOAD,
    INDEX_MAP,
    INDEX_MAP_EFFECTIVE,
    LOAD_ABSENT_STEP,
    LOAD_NO_GRAD,
    MATCH_GROUPS,
    PARAM_GROUPS,
    REALIGN,
    RESTORE_STEP,
    STATE_AFTER_LOAD,
    STATE_AFTER_LOAD_RAW,
    STATE_AFTER_SAVE,
    STATE_AT_SAVE,
    FindingProbe,
    PhaseDocument,
    PhaseName,
    PhaseProbes,
    ProbeFindingRow,
)
from jobs.signature_names import (
    ADAM_STEP_NOT_RESTORED,
    ADAM_STEP_UNEXPLAINED,
    BUCKET_OFFSET_UNALIGNED,
    FP32_VIEW_INPLACE_LOAD,
    LAYERWISE_METADATA_MISMATCH,
    LR_SCHEDULE_MISMATCH,
    OPTIMIZER_INDEX_MISALIGNMENT,
    OPTIMIZER_INDEX_UNEXPLAINED,
    OPTIMIZER_STATE_MISMATCH,
    OPTIMIZER_STEP_KEY_MISSING,
    PARAM_GROUP_IDENTITY_COLLISION,
    PARAM_GROUP_SCALARS_MISMATCH,
    PROBE_NOT_APPLICABLE,
)
from jobs.spec import RunSpec
from jobs.verdict.state_diff import (
    groups_after_optimizer_load,
    mutation_findings,
    restore_findings,
)

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


def unexplained_index_entries(doc: PhaseDocument | None) -> dict[str, Any] | None:
    """Index-map entries as built that are at neither the param's own slot nor Bug A's: a new bug.

    Read from the map as the build made it (before any workaround), so requesting
    realign-param-index never hides one; None when every misaligned entry is Bug A's.
    """
    raw = _probes(doc).get(INDEX_MAP)
    if not raw or not raw.get("unexplained_total"):
        return None
    items = [
        {
            "rank": r,
            "optimizer": o["optimizer"],
            "param": m["param"],
            "slot": [m["group"], m["index"]],
            "own_slot": [m["group"], m["expected_index"]],
            "slot_holds": m["installed_param"],
        }
        for r, rank_report in enumerate(raw["per_rank"])
        for o in rank_report["optimizers"]
        for m in o["misaligned"]
        if m.get("bug_a_predicted") is False
    ]
    names = list(dict.fromkeys(str(i["param"]) for i in items))
    return {"count": raw["unexplained_total"], "names": names[:MAX_ITEMS], "items": items[:MAX_ITEMS]}


def _workaround_reports(doc: PhaseDocument | None) -> dict[str, Any]:
    return (doc.get("workarounds") or {}) if doc else {}


def _needed(report: Any) -> bool | None:
    """Whether a workaround's report says its bug fired (None: the report does not say; load-no-grad is a flag)."""
    value = report.get("needed") if isinstance(report, dict) else None
    return value if isinstance(value, bool) else None


def _per_rank_diffs(before: list[Any] | None, after: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for rank, (a, b) in enumerate(zip(before or [], after or [], strict=False)):
        if not a or not b:
            continue
        for d in fingerprint_diff(a, b):
            out.append({"rank": rank, **d})
    return out


def _legacy_restore(at_save: dict[str, Any], after_load: dict[str, Any]) -> dict[str, Any]:
    """Restore evidence from documents written before the state snapshot existed."""
    ev: dict[str, Any] = {}
    restore_diffs = _per_rank_diffs(at_save.get("owned"), after_load.get("owned"))
    state_diffs = [d for d in restore_diffs if d["key"] != "step"]
    if state_diffs:
        ev[OPTIMIZER_STATE_MISMATCH] = {
            "after_load_differs_from_save": {"count": len(state_diffs), "items": state_diffs[:MAX_ITEMS]}
        }
    step_diffs = [d for d in restore_diffs if d["key"] == "step"]
    if step_diffs:
        ev[ADAM_STEP_NOT_RESTORED] = {"params_affected": len(step_diffs), "items": step_diffs[:3]}
    return ev


def _restore_evidence(
    baseline: PhaseDocument | None, resumed: PhaseDocument | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(findings after every workaround, findings a post-load workaround neutralised)."""
    saved = _probes(baseline).get(STATE_AT_SAVE)
    raw = _probes(resumed).get(STATE_AFTER_LOAD_RAW)
    if not any(saved or []) or not any(raw or []):  # documents without the snapshot's sections
        at_save = dict(_probes(baseline).get(FINGERPRINTS["at_save"]) or {})
        after_load = dict(_probes(resumed).get(FINGERPRINTS["after_load"]) or {})
        return _legacy_restore(at_save, after_load), {}
    effective = restore_findings(saved, _probes(resumed).get(STATE_AFTER_LOAD) or raw)
    before_workarounds = restore_findings(saved, raw)
    return effective, {k: v for k, v in before_workarounds.items() if k not in effective}


def _step_details(spec: RunSpec, resumed: PhaseDocument | None, ev: dict[str, Any]) -> dict[str, Any]:
    info = resumed["info"] if resumed else {}
    return {
        "step": spec.save_step + 1,
        "checkpoint_step": info.get("checkpoint_adam_step"),
        "adam_steps_after_load": info.get("adam_steps_after_load"),
        "params_affected": ev.get("count", ev.get("params_affected")),
        **ev,
    }


def _fp32_view(resumed: PhaseDocument | None) -> dict[str, Any] | None:
    per_rank = _probes(resumed).get(FP32_VIEW_INPLACE) or []
    hits = [{"rank": r, **p} for r, p in enumerate(per_rank) if p and p.get("would_raise")]
    if not hits:
        return None
    return {"ranks": [h["rank"] for h in hits], "params": hits[0]["params"], "message": hits[0]["message"]}


def collect_evidence(
    spec: RunSpec, baseline: PhaseDocument | None, resumed: PhaseDocument | None, lane: dict[str, Any]
) -> dict[str, Any]:
    """Return {signature name: evidence} for every signature the probes support.

    The entry `_worked_around` maps each finding a workaround neutralised to {"by", "evidence"}.
    """
    ev: dict[str, Any] = {}
    hidden: dict[str, Any] = {}
    misaligned, worked_around = index_map_findings(baseline)
    if misaligned is None and baseline is None:
        misaligned, worked_around = index_map_findings(resumed)
    if misaligned:
        ev[OPTIMIZER_INDEX_MISALIGNMENT] = misaligned
    unexplained = unexplained_index_entries(baseline) or unexplained_index_entries(resumed)
    if unexplained:
        ev[OPTIMIZER_INDEX_UNEXPLAINED] = unexplained
    if worked_around:
        raw_map = _probes(baseline or resumed).get(INDEX_MAP)
        hidden[OPTIMIZER_INDEX_MISALIGNMENT] = {
            "by": REALIGN,
            "evidence": {"misaligned_total": raw_map["misaligned_total"] if raw_map else None},
        }
    at_save: dict[str, Any] = dict(_probes(baseline).get(FINGERPRINTS["at_save"]) or {})
    slot_diffs = _per_rank_diffs(at_save.get("owned"), at_save.get("slots"))
    restored, hidden_by_restore = _restore_evidence(baseline, resumed)
    for name, found in hidden_by_restore.items():
        hidden[name] = {"by": RESTORE_STEP, "evidence": found}
    if slot_diffs:
        restored.setdefault(OPTIMIZER_STATE_MISMATCH, {})["checkpoint_slot_differs_from_owner"] = {
            "count": len(slot_diffs),
            "items": slot_diffs[:MAX_ITEMS],
        }
    if ADAM_STEP_NOT_RESTORED in restored:
        restored[ADAM_STEP_NOT_RESTORED] = _step_details(spec, resumed, restored[ADAM_STEP_NOT_RESTORED])
    ev.update(restored)
    ev.update(mutation_findings(_probes(baseline).get(STATE_AT_SAVE), _probes(baseline).get(STATE_AFTER_SAVE)))
    bug_c = groups_after_optimizer_load(
        _probes(baseline).get(STATE_AT_SAVE), _probes(resumed).get(GROUPS_AFTER_OPTIMIZER_LOAD)
    )
    for name, found in bug_c.items():
        ev[name] = {**ev[name], "after_optimizer_load": found} if name in ev else found
    if lane["lr_mismatched_steps"]:
        ev[LR_SCHEDULE_MISMATCH] = {
            "steps": lane["lr_mismatched_steps"][:MAX_ITEMS],
            "first_step": lane["lr_mismatched_steps"][0],
        }
    groups = _probes(resumed).get(PARAM_GROUPS["after_load"])
    if groups and not groups["agree"]:
        legacy = {
            "disagreements": groups["disagreements"][:MAX_ITEMS],
            "empty_rank_groups": groups["empty_rank_groups"],
        }
        ev[LAYERWISE_METADATA_MISMATCH] = {**legacy, **ev.get(LAYERWISE_METADATA_MISMATCH, {})}
    buckets = _probes(baseline).get(BUCKETS) or _probes(resumed).get(BUCKETS)
    if buckets and buckets["unaligned_total"]:
        issues = [
            {"rank": r, "buffer": b["buffer"], **i}
            for r, rep in enumerate(buckets["per_rank"])
            for b in rep["buffers"]
            for i in b["issues"]
        ]
        ev[BUCKET_OFFSET_UNALIGNED] = {"count": len(issues), "items": issues[:MAX_ITEMS]}
    skipped = not_applicable(baseline, resumed)
    if skipped:
        ev[PROBE_NOT_APPLICABLE] = {"probes": skipped}
    step_report = _workaround_reports(resumed).get(RESTORE_STEP) or {}
    resumed_info: dict[str, Any] = resumed["info"] if resumed else {}
    shared = int(resumed_info.get("adam_step_shared_after_load") or 0)
    if shared:
        found = {"step": spec.save_step + 1, "shared_step_tensor_params": shared,
                 "meaning": "every param's Adam step is one tensor after the load; torch Adam advances it "
                            "once per param per step"}
        if step_report.get("needed") and not step_report.get("unexplained"):  # every step is a fresh tensor
            hidden[ADAM_STEP_NOT_RESTORED] = {"by": RESTORE_STEP, "evidence": found}
        else:
            ev[ADAM_STEP_NOT_RESTORED] = {**ev.get(ADAM_STEP_NOT_RESTORED, {}), **found}
    if step_report.get("unexplained"):
        ev[ADAM_STEP_UNEXPLAINED] = {
            "section": "step",
            "step": spec.save_step + 1,
            "steps_after_load": step_report.get("before"),
            "checkpoint_step": step_report.get("checkpoint_step"),
            "priming_steps": step_report.get("primed"),
            "unexplained_values": step_report["unexplained"],
        }
    _group_identity(resumed, hidden, ev)
    absent = _workaround_reports(resumed).get(LOAD_ABSENT_STEP) or {}
    if absent.get("needed"):
        hidden[OPTIMIZER_STEP_KEY_MISSING] = {"by": LOAD_ABSENT_STEP, "evidence": {"params": absent["params"]}}
    needed = [[_needed(_workaround_reports(d).get(name)) for d in (baseline, resumed)] for name in spec.workarounds]
    not_needed = [name for name, n in zip(spec.workarounds, needed, strict=True) if False in n and True not in n]
    if not_needed:
        ev["_not_needed"] = not_needed
    view = _fp32_view(resumed)
    if view:
        hidden[FP32_VIEW_INPLACE_LOAD] = {"by": LOAD_NO_GRAD if LOAD_NO_GRAD in spec.workarounds else REALIGN,
                                            "evidence": view}
    _applied_evidence(spec, baseline, resumed, ev)  # last: it joins a step finding the lines above made
    if hidden:
        ev["_worked_around"] = hidden
    return ev


# What each entry of a step record's `applied` holds, and the signature a difference in it names. An Adam
# step that differs is the step restore's own finding when the state diff made one (its evidence is added
# there, so one fault keeps one signature); only a step no restore finding explains is a param-group one.
APPLIED_SCALARS = (("lr", LR_SCHEDULE_MISMATCH), ("weight_decay", PARAM_GROUP_SCALARS_MISMATCH),
                   ("adam_step", PARAM_GROUP_SCALARS_MISMATCH))
STEP_FINDINGS = (ADAM_STEP_NOT_RESTORED, ADAM_STEP_UNEXPLAINED)


def applied_differences(spec: RunSpec, baseline: PhaseDocument | None,
                        resumed: PhaseDocument | None) -> list[dict[str, Any]]:
    """Each resumed step's param-group scalar that the resumed run applied differently from the baseline."""
    base = {r["step"]: r.get("applied") for r in (baseline["steps"] if baseline else [])}
    out: list[dict[str, Any]] = []
    for record in resumed["steps"] if resumed else []:
        was, now = base.get(record["step"]), record.get("applied")
        if record["step"] <= spec.save_step or not was or not now:
            continue  # documents from before the field compare through the lr lane alone
        for group in sorted(set(was) | set(now)):
            a, b = was.get(group), now.get(group)
            for k, (name, _sig) in enumerate(APPLIED_SCALARS):
                va, vb = (a[k] if a else None), (b[k] if b else None)
                if va != vb:
                    out.append({"step": record["step"], "group": group, "scalar": name, "baseline": va, "resumed": vb})
    return out


def _applied_evidence(spec: RunSpec, baseline: PhaseDocument | None, resumed: PhaseDocument | None,
                      ev: dict[str, Any]) -> None:
    """Name a wrong applied LR as an LR cause, a wrong weight decay or step as a param-group one."""
    diffs = applied_differences(spec, baseline, resumed)
    for scalar, signature in APPLIED_SCALARS:
        items = [d for d in diffs if d["scalar"] == scalar]
        if scalar == "adam_step":
            signature = next((s for s in STEP_FINDINGS if s in ev), signature)
        if items:
            found = {"count": len(items), "first_step": items[0]["step"], "items": items[:MAX_ITEMS]}
            named = list(dict.fromkeys(f"applied {scalar} {d['group']}" for d in items))
            previous = ev.get(signature, {})
            ev[signature] = {**previous, f"applied_{scalar}": found, "names": [*previous.get("names", []), *named]}


def _group_identity(resumed: PhaseDocument | None, hidden: dict[str, Any], ev: dict[str, Any]) -> None:
    """Param groups the build's load cannot tell apart: the known bug's cause, or what its workaround hid."""
    found = (resumed["info"] if resumed else {}).get("param_group_identity") or {}
    if not found.get("collisions") or found.get("bounds_in_keys"):
        return
    evidence = {"collisions": found["collisions"][:MAX_ITEMS], "identifier_keys": found.get("identifier_keys")}
    report = _workaround_reports(resumed).get(MATCH_GROUPS) or {}
    if report.get("added_keys"):
        hidden[PARAM_GROUP_IDENTITY_COLLISION] = {"by": MATCH_GROUPS, "evidence": evidence}
    else:
        ev[PARAM_GROUP_IDENTITY_COLLISION] = evidence


def not_applicable(baseline: PhaseDocument | None, resumed: PhaseDocument | None) -> dict[str, Any]:
    """{"phase.probe": reason} for every build probe that could not look on this build (compat.guarded)."""
    phases: tuple[tuple[str, PhaseDocument | None], ...] = (("train_and_save", baseline), ("resume", resumed))
    out: dict[str, Any] = {}
    for phase, doc in phases:
        probes = _probes(doc)
        for key in (INDEX_MAP, INDEX_MAP_EFFECTIVE, BUCKETS):
            report = probes.get(key)
            if report and not report.get("applicable", True):
                out[f"{phase}.{key}"] = report.get("reason") or "not applicable on this build"
    return out


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
    # per-rank shards line up only when both phases ran with the same number of ranks (no reshard)
    if at_save.get("owned") and after.get("owned") and len(at_save["owned"]) == len(after["owned"]):
        diffs = _per_rank_diffs(at_save.get("owned"), after.get("owned"))
        rows.append(_finding("resume", "restored_state_fingerprints", not diffs, differing=len(diffs)))
        rows += [_finding("resume", "restored_state_fingerprints", False, d["param"], **d) for d in diffs]
    return rows[:MAX_FINDINGS]
