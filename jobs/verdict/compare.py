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

from typing import Any

from jobs.spec import RunSpec, SpecError
from jobs.verdict.evidence import collect_evidence, probe_findings
from jobs.verdict.signatures import SIGNATURES, classify_error
from jobs.verdict.tolerance import TOLERANCE_PROFILES, ToleranceProfile


def same_value(a: float, b: float) -> bool:
    """Equal, counting two NaNs as the same value: a resume that reproduces a NaN loss is still the same run."""
    return a == b or (a != a and b != b)


def _delta(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    if same_value(a, b):
        return 0.0, 0.0
    d = b - a
    return d, (abs(d) / abs(a) if a != 0 else (0.0 if d == 0 else float("inf")))


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return same_value(a, b) or abs(b - a) <= atol + rtol * abs(a)


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
            row["exact"] = same_value(b["loss"], r["loss"]) and same_value(b["lr"], r["lr"])
            row["loss_within_tolerance"] = _close(b["loss"], r["loss"], profile.loss_rtol, profile.loss_atol)
            row["lr_within_tolerance"] = _close(b["lr"], r["lr"], profile.lr_rtol, profile.lr_atol)
            row["within_tolerance"] = row["loss_within_tolerance"] and row["lr_within_tolerance"]
        rows.append(row)
    return rows


def lanes(spec: RunSpec, rows: list[dict[str, Any]], profile: ToleranceProfile) -> dict[str, Any]:
    """Summarise the exact lane and the tolerance lane over the resumed steps."""
    compared = [r for r in rows if r["resumed_phase"] and "exact" in r]
    complete = len(compared) == len(spec.resumed_steps)
    inexact = [r["step"] for r in compared if not r["exact"]]
    beyond = [r["step"] for r in compared if not r["within_tolerance"]]
    lr_off = [r["step"] for r in compared if not same_value(r["lr_baseline"], r["lr_resumed"])]
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


def _error_verdict(errors: list[dict[str, Any]], causes: list[str]) -> tuple[str, list[str]]:
    names: list[str] = []
    for err in errors:
        names += [n for n in classify_error(err) if n not in names]
    explained = [n for n in names if SIGNATURES[n].kind == "cause"]
    for err in errors:
        # A save/load crash on a build whose index map the probe found misaligned is Bug A.
        if err.get("stage") in ("save", "load") and "optimizer-index-misalignment" in causes:
            explained.append("optimizer-index-misalignment")
    names += [n for n in dict.fromkeys(explained) if n not in names]
    return ("fail" if explained else "error"), names


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
            "signatures": [],
            "advisories": [],
            "worked_around": [],
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
    worked_around = evidence.pop("_worked_around", [])
    causes = [n for n in evidence if SIGNATURES[n].kind == "cause"]
    advisories = [n for n in evidence if SIGNATURES[n].kind == "latent"]
    errors = [d["error"] for d in (baseline_doc, resumed_doc) if d and d.get("status") == "error" and d.get("error")]
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
        verdict, crash_names = _error_verdict(errors, causes)
        signatures = crash_names + [c for c in causes if c not in crash_names]
    else:
        if not lane["tolerance"]["pass"] and not causes:
            causes.append("loss-divergence-unexplained")
            evidence["loss-divergence-unexplained"] = {"failing_steps": lane["tolerance"]["failing_steps"]}
        verdict = "fail" if causes or not lane["tolerance"]["pass"] else "pass"
        signatures = causes
    return {
        "verdict": verdict,
        "signatures": signatures,
        "advisories": advisories,
        "worked_around": worked_around,
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
