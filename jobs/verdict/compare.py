"""Compare a baseline (train_and_save) document with a resumed one: lanes, evidence, verdict.

Pure functions over plain data; no torch. Verdict rules:
- `fail`: the tolerance lane fails, or a probe found a known cause (misaligned index map,
  optimizer state not restored exactly, lr mismatch, ranks disagreeing on group metadata), or a
  phase crashed and the crash is explained by a known cause (e.g. the dp_reshardable assertion
  with a detected misalignment). Restored state is compared exactly whatever the tolerance
  profile: loading is a copy, so any difference is a defect, not numerical noise.
- `error`: a phase crashed with no known cause, or a document is missing.
- `pass`: otherwise. Latent findings (kind "latent") go to `advisories` and do not fail a run.
"""

from __future__ import annotations

import math
from typing import Any

from jobs.errors import dedupe_errors
from jobs.spec import RunSpec, SpecError
from jobs.verdict.evidence import collect_evidence, final_state_evidence, probe_findings
from jobs.verdict.signatures import SIGNATURES, UNSUPPORTED, classify_error
from jobs.verdict.tolerance import TOLERANCE_PROFILES, ToleranceProfile


def _delta(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    if same(a, b):
        return 0.0, 0.0
    d = b - a
    return d, (abs(d) / abs(a) if a != 0 else (0.0 if d == 0 else float("inf")))


def same(a: Any, b: Any) -> bool:
    """Exact equality where two NaNs of the same metric count as equal (both runs blew up alike)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if same(a, b):
        return True
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return False
    return abs(b - a) <= atol + rtol * abs(a)


# Per-step metrics compared besides the lr: Megatron's own resume test compares num-zeros.
COMPARED_METRICS = ("loss", "grad_norm", "num_zeros")


def step_rows(
    spec: RunSpec, baseline: dict[str, Any] | None, resumed: dict[str, Any] | None, profile: ToleranceProfile
) -> list[dict[str, Any]]:
    """Join both runs per step (1..M) with loss/lr deltas and the exact/tolerance checks.

    `*_abs_delta` is resumed - baseline (signed); `*_rel_delta` is |delta| / |baseline|.
    """
    base = {r["step"]: r for r in (baseline or {}).get("steps", [])}
    res = {r["step"]: r for r in (resumed or {}).get("steps", [])}
    rows = []
    for step in range(1, spec.steps + 1):
        b, r = base.get(step), res.get(step)
        row: dict[str, Any] = {"step": step, "resumed_phase": step > spec.save_step}
        for key in ("loss", "lr", "grad_norm", "num_zeros", "wall_s"):
            row[f"{key}_baseline"], row[f"{key}_resumed"] = (b or {}).get(key), (r or {}).get(key)
        for key in ("loss", "lr"):
            row[f"{key}_abs_delta"], row[f"{key}_rel_delta"] = _delta(row[f"{key}_baseline"], row[f"{key}_resumed"])
        row["within_tolerance"] = None
        if b is not None and r is not None:
            differing = [k for k in (*COMPARED_METRICS, "lr") if not same(b.get(k), r.get(k))]
            row["exact"] = not differing
            row["differing_metrics"] = differing
            row["loss_within_tolerance"] = _close(b["loss"], r["loss"], profile.loss_rtol, profile.loss_atol)
            row["lr_within_tolerance"] = _close(b["lr"], r["lr"], profile.lr_rtol, profile.lr_atol)
            # grad norm and num-zeros get the loss's tolerance (Megatron compares num-zeros like loss)
            row["metrics_within_tolerance"] = all(
                _close(b.get(k), r.get(k), profile.loss_rtol, profile.loss_atol) for k in ("grad_norm", "num_zeros")
            )
            row["within_tolerance"] = (
                row["loss_within_tolerance"] and row["lr_within_tolerance"] and row["metrics_within_tolerance"]
            )
        rows.append(row)
    return rows


def lanes(spec: RunSpec, rows: list[dict[str, Any]], profile: ToleranceProfile) -> dict[str, Any]:
    """Summarise the exact lane and the tolerance lane over the resumed steps."""
    compared = [r for r in rows if r["resumed_phase"] and "exact" in r]
    complete = len(compared) == len(spec.resumed_steps)
    inexact = [r["step"] for r in compared if not r["exact"]]
    beyond = [r["step"] for r in compared if not r["within_tolerance"]]
    lr_off = [r["step"] for r in compared if not same(r["lr_baseline"], r["lr_resumed"])]
    allowed = profile.max_failing_steps(len(spec.resumed_steps))
    return {
        "compared_steps": len(compared),
        "complete": complete,
        "exact": {
            "pass": complete and not inexact,
            "mismatched_steps": inexact,
            "first_divergent_step": inexact[0] if inexact else None,
        },
        "tolerance": {
            "profile": profile.to_dict(),
            "pass": complete and len(beyond) <= allowed,
            "failing_steps": beyond,
            "allowed_failing_steps": allowed,
            "first_step_beyond_tolerance": beyond[0] if beyond else None,
        },
        "lr_mismatched_steps": lr_off,
    }


def _phase_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    return {
        "status": doc.get("status"),
        "error": doc.get("error"),
        "info": doc.get("info", {}),
        "stage_seconds": doc.get("stage_seconds", {}),
        "workarounds": doc.get("workarounds", {}),
    }


def _error_verdict(errors: list[dict[str, Any]], causes: list[str]) -> tuple[str, list[str], list[str]]:
    """(verdict, signatures, causes moved to advisories) for a run in which a phase crashed.

    A crash is attributed to a known bug only by its own stage, type and message; a crash that
    comes with measured evidence (a probe's cause) is a `fail` with that evidence. An option the
    build does not have is `unsupported-by-build` and an `error`: no measured finding explains it.
    """
    names: list[str] = []
    for err in errors:
        names += [n for n in classify_error(err) if n not in names]
    if UNSUPPORTED in names:
        return "error", names, causes
    explained = [n for n in names if SIGNATURES[n].kind == "cause"] + causes
    names += [n for n in causes if n not in names]
    return ("fail" if explained else "error"), names, []


def verdict_label(verdict: str, worked_around: list[str]) -> str:
    """The verdict as the matrix shows it: a pass that needed a workaround to hide a finding is
    `pass (worked around)`, never a plain pass."""
    return "pass (worked around)" if verdict == "pass" and worked_around else verdict


def evaluate(
    spec_dict: dict[str, Any], baseline_doc: dict[str, Any] | None, resumed_doc: dict[str, Any] | None
) -> dict[str, Any]:
    """Evaluate one parity run from its two phase documents (either may be None if not run)."""
    try:
        spec = RunSpec.from_dict(spec_dict)
    except SpecError as exc:
        err = {"type": "SpecError", "message": str(exc), "traceback": "", "stage": "spec"}
        return {
            "verdict": "error",
            "verdict_label": "error",
            "signatures": [],
            "advisories": [],
            "worked_around": [],
            "worked_around_by": {},
            "worked_around_evidence": {},
            "evidence": {},
            "errors": [err],
            "error": err,
            "probe_findings": [],
            "first_divergent_step": None,
            "first_step_beyond_tolerance": None,
            "lanes": {},
            "steps": [],
            "spec": spec_dict,
            "probes": {},
            "phases": {},
        }
    profile = TOLERANCE_PROFILES[spec.tolerance]
    rows = step_rows(spec, baseline_doc, resumed_doc, profile)
    lane = lanes(spec, rows, profile)
    evidence = collect_evidence(spec, baseline_doc, resumed_doc, lane)
    hidden = evidence.pop("_worked_around", {})
    causes = [n for n in evidence if SIGNATURES[n].kind == "cause"]
    advisories = [n for n in evidence if SIGNATURES[n].kind == "latent"]
    errors = dedupe_errors(
        [d["error"] for d in (baseline_doc, resumed_doc) if d and d.get("status") == "error" and d.get("error")]
    )
    if baseline_doc is None or (resumed_doc is None and not errors):
        verdict, signatures = "error", causes
        errors = errors or [
            {
                "type": "MissingResult",
                "message": "a phase produced no document",
                "traceback": "",
                "stage": "launch",
            }
        ]
    elif errors:
        verdict, signatures, unexplained = _error_verdict(errors, causes)
        advisories += [n for n in unexplained if n not in advisories]
    else:
        final = final_state_evidence(baseline_doc, resumed_doc)
        if final and not causes:
            # Restored state matched, yet the runs ended apart: the resumed loop itself differs.
            causes.append("final-state-mismatch")
            evidence.update(final)
        if not lane["tolerance"]["pass"] and not causes:
            causes.append("loss-divergence-unexplained")
            evidence["loss-divergence-unexplained"] = {
                "failing_steps": lane["tolerance"]["failing_steps"],
                "metrics": sorted({m for r in rows if r.get("differing_metrics") for m in r["differing_metrics"]}),
            }
        verdict = "fail" if causes or not lane["tolerance"]["pass"] else "pass"
        signatures = causes
    worked_around = sorted(hidden)
    by: dict[str, list[str]] = {}
    for name in worked_around:
        by.setdefault(hidden[name]["by"], []).append(name)
    return {
        "verdict": verdict,
        "verdict_label": verdict_label(verdict, worked_around),
        "signatures": signatures,
        "advisories": advisories,
        "worked_around": worked_around,
        "worked_around_by": by,
        "worked_around_evidence": {n: hidden[n]["evidence"] for n in worked_around},
        "evidence": evidence,
        "errors": errors,
        "error": errors[0] if errors else None,
        "probe_findings": probe_findings(baseline_doc, resumed_doc),
        "first_divergent_step": lane["exact"]["first_divergent_step"],
        "first_step_beyond_tolerance": lane["tolerance"]["first_step_beyond_tolerance"],
        "lanes": lane,
        "steps": rows,
        "spec": spec.to_dict(),
        "probes": {
            "train_and_save": (baseline_doc or {}).get("probes"),
            "resume": (resumed_doc or {}).get("probes"),
        },
        "phases": {"train_and_save": _phase_summary(baseline_doc), "resume": _phase_summary(resumed_doc)},
    }
