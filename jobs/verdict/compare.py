"""Compare a baseline (train_and_save) document with a resumed one: lanes, evidence, verdict.

Pure functions over plain data; no torch. Verdict rules:
- `fail`: the tolerance lane fails, or a probe found a known cause (misaligned index map,
  optimizer state not restored exactly, lr mismatch, ranks disagreeing on group metadata), or a
  phase crashed and the crash is explained by a known cause (e.g. the dp_reshardable assertion
  with a detected misalignment). Restored state is compared exactly whatever the tolerance
  profile: loading is a copy, so any difference is a defect, not numerical noise.
- `error`: a phase crashed with no known cause, a document is missing, or a finished phase's
  document lacks a probe its spec requires (`required_probes`): missing evidence is never a pass.
- `pass`: otherwise. Latent findings (kind "latent") go to `advisories` and do not fail a run.
"""

from __future__ import annotations

import math
from typing import Any

from jobs.contract import (
    ErrorRecord,
    ParityResult,
    PhaseDocument,
    PhaseSummary,
    SignatureId,
    StepRecord,
    StepRow,
    error_record,
    parity_result,
    required_probes,
)
from jobs.errors import with_rank_errors
from jobs.signature_names import FINAL_STATE_MISMATCH, LOSS_DIVERGENCE_UNEXPLAINED, SIGNATURE_IDS, UNSUPPORTED_BY_BUILD
from jobs.spec import RunSpec, SpecError
from jobs.tolerance import ToleranceProfile
from jobs.verdict import causes as lost
from jobs.verdict import final_state
from jobs.verdict.build_crash import raised_in_build
from jobs.verdict.evidence import collect_evidence, probe_findings
from jobs.verdict.profile import judged_profile, reshard_fields
from jobs.verdict.signatures import SIGNATURES, classify_error
from jobs.verdict_label import verdict_label
from jobs.verdict_names import ERROR, FAIL, PASS, Verdict


def same_value(a: float | None, b: float | None) -> bool:
    """Equal, counting two NaNs as the same value: a resume that reproduces a NaN loss is still the same run."""
    return a == b or (a is not None and b is not None and a != a and b != b)


def _delta(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    if same(a, b):
        return 0.0, 0.0
    d = b - a
    return d, (abs(d) / abs(a) if a != 0 else (0.0 if d == 0 else float("inf")))


# The per-step values compared side by side (keys of StepRecord).
STEP_KEYS: tuple[str, ...] = ("loss", "lr", "grad_norm", "num_zeros", "wall_s")


def _value(record: StepRecord | None, key: str) -> Any:
    return None if record is None else record[key]  # type: ignore[literal-required]


def same(a: Any, b: Any) -> bool:
    """Exact equality where two NaNs of the same metric count as equal (both runs blew up alike)."""
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if same(a, b):
        return True
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return False
    return bool(abs(b - a) <= atol + rtol * abs(a))


# Per-step metrics compared besides the lr: Megatron's own resume test compares num-zeros.
COMPARED_METRICS: tuple[str, ...] = ("loss", "grad_norm", "num_zeros")
# Compared exactly under every profile: a step one run skipped (inf/NaN grads) and the other applied.
DISCRETE_METRICS: tuple[str, ...] = ("update_successful",)


def step_rows(
    spec: RunSpec, baseline: PhaseDocument | None, resumed: PhaseDocument | None, profile: ToleranceProfile
) -> list[StepRow]:
    """Join both runs per step (1..M) with loss/lr deltas and the exact/tolerance checks.

    `*_abs_delta` is resumed - baseline (signed); `*_rel_delta` is |delta| / |baseline|.
    """
    base = {r["step"]: r for r in (baseline["steps"] if baseline else [])}
    res = {r["step"]: r for r in (resumed["steps"] if resumed else [])}
    rows: list[StepRow] = []
    metrics_rtol = profile.metrics_bound()
    for step in range(1, spec.steps + 1):
        b, r = base.get(step), res.get(step)
        row: dict[str, Any] = {"step": step, "resumed_phase": step > spec.save_step}
        for key in STEP_KEYS:
            row[f"{key}_baseline"], row[f"{key}_resumed"] = _value(b, key), _value(r, key)
        for key in ("loss", "lr"):
            row[f"{key}_abs_delta"], row[f"{key}_rel_delta"] = _delta(row[f"{key}_baseline"], row[f"{key}_resumed"])
        row["within_tolerance"] = None
        if b is not None and r is not None:
            differing = [
                k for k in (*COMPARED_METRICS, "lr", *DISCRETE_METRICS) if not same(b.get(k), r.get(k))  # type: ignore[misc]
            ]
            row["exact"] = not differing
            row["differing_metrics"] = differing
            row["loss_within_tolerance"] = _close(b["loss"], r["loss"], profile.loss_rtol, profile.loss_atol)
            row["lr_within_tolerance"] = _close(b["lr"], r["lr"], profile.lr_rtol, profile.lr_atol)
            # grad norm and num-zeros get the loss's tolerance (Megatron compares num-zeros like loss)
            row["metrics_within_tolerance"] = all(
                _close(_value(b, k), _value(r, k), metrics_rtol, profile.loss_atol)
                for k in ("grad_norm", "num_zeros")
            ) and all(same(b.get(k), r.get(k)) for k in DISCRETE_METRICS)  # type: ignore[misc]
            row["within_tolerance"] = (
                row["loss_within_tolerance"] and row["lr_within_tolerance"] and row["metrics_within_tolerance"]
            )
        rows.append(row)  # type: ignore[arg-type]  # built key by key above; StepRow lists every key
    return rows


def lanes(spec: RunSpec, rows: list[StepRow], profile: ToleranceProfile) -> dict[str, Any]:
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


def _phase_summary(doc: PhaseDocument | None) -> PhaseSummary | None:
    if doc is None:
        return None
    summary: PhaseSummary = {
        "status": doc["status"],
        "error": doc.get("error"),
        "info": doc.get("info", {}),
        "stage_seconds": doc.get("stage_seconds", {}),
        "workarounds": doc.get("workarounds", {}),
    }
    if "rank_nodes" in doc:  # multi-node: which node each rank ran on
        summary["rank_nodes"] = doc["rank_nodes"]
    return summary


def missing_probes(spec: RunSpec, doc: PhaseDocument | None) -> list[ErrorRecord]:
    """An error record for each probe the phase's spec (and the stage it reached) requires but its document lacks."""
    if doc is None:
        return []
    probes = doc.get("probes") or {}
    err = doc.get("error")
    failed_stage = None if doc.get("status") == "ok" else (err["stage"] if err else "start")
    return [
        error_record(
            "MissingProbe",
            f"probes.{key}: the {doc['phase']} document lacks a probe its spec requires",
            stage="evaluate",
        )
        for key in required_probes(doc["phase"], spec.workarounds, failed_stage, doc.get("schema_version", 1))
        if not probes.get(key)
    ]


def _error_verdict(
    errors: list[ErrorRecord], causes: list[SignatureId]
) -> tuple[Verdict, list[SignatureId], list[SignatureId]]:
    """(verdict, signatures, causes moved to advisories) for a run in which a phase crashed.

    A crash is attributed to a known bug only by its own stage, type and message; a crash that
    comes with measured evidence (a probe's cause) is a `fail` with that evidence, and so is a save or
    load that raised inside the build's own code (build_crash.py: the build cannot checkpoint or resume).
    An option the build does not have is `unsupported-by-build` and an `error`: no measured finding
    explains it; so is any other crash (the harness's, the host's, a rank that died).
    """
    names: list[SignatureId] = []
    for err in errors:
        names += [n for n in classify_error(err) if n not in names]
    names.sort(key=lambda n: SIGNATURES[n].kind != "crash")  # where it crashed first, then why
    if UNSUPPORTED_BY_BUILD in names:
        return ERROR, names, causes
    explained = [n for n in names if SIGNATURES[n].kind == "cause"] + causes
    in_build = any(raised_in_build(err) for err in errors)
    names += [n for n in causes if n not in names]
    return (FAIL if explained or in_build else ERROR), names, []


def _build_crash_lines(errors: list[ErrorRecord], signatures: list[SignatureId]) -> dict[SignatureId, str]:
    """A cause line per checkpoint stage that raised inside the build: what raised, where, and its message
    (which names the tensor or key the build could not save or load)."""
    lines: dict[SignatureId, str] = {}
    if any(SIGNATURES[n].kind == "cause" for n in signatures):
        return lines  # a measured cause (a known bug) explains the crash: its own line says why
    for err in errors:
        frame = raised_in_build(err)
        crash = next((n for n in classify_error(err) if SIGNATURES[n].kind == "crash"), None)
        if frame and crash and crash in signatures and crash not in lines:
            message = " ".join(str(err.get("message") or "").split())[:160]
            lines[crash] = f"{crash}: {err['type']} raised in the build's {frame} during {err['stage']}: {message}"
    return lines


def evaluate(
    spec_dict: dict[str, Any], baseline_doc: PhaseDocument | None, resumed_doc: PhaseDocument | None
) -> ParityResult:
    """Evaluate one parity run from its two phase documents (either may be None if not run)."""
    try:
        spec = RunSpec.from_dict(spec_dict)
    except SpecError as exc:
        return parity_result(ERROR, spec_dict, errors=[error_record("SpecError", str(exc), stage="spec")])
    profile, not_judged = judged_profile(spec)
    rows = step_rows(spec, baseline_doc, resumed_doc, profile)
    lane = lanes(spec, rows, profile)
    evidence = collect_evidence(spec, baseline_doc, resumed_doc, lane)
    hidden: dict[str, Any] = evidence.pop("_worked_around", {})
    not_needed: list[str] = evidence.pop("_not_needed", [])
    causes = [n for n in SIGNATURE_IDS if n in evidence and SIGNATURES[n].kind == "cause"]
    advisories = [n for n in SIGNATURE_IDS if n in evidence and SIGNATURES[n].kind == "latent"]
    errors = [
        with_rank_errors(e, e.get("rank_errors") or [])
        for d in (baseline_doc, resumed_doc)
        if d and d.get("status") == "error" and (e := d.get("error"))
    ]
    missing = missing_probes(spec, baseline_doc) + missing_probes(spec, resumed_doc)
    # no measured bound: a run that ran to the end cannot be judged (a crash is judged by its cause)
    missing += [not_judged] if not_judged and not errors and baseline_doc and resumed_doc else []
    lane["final_state"] = final_state.lane(profile, resumed_doc)
    verdict: Verdict
    if baseline_doc is None or (resumed_doc is None and not errors):
        verdict, signatures = ERROR, causes
        errors = errors or [error_record("MissingResult", "a phase produced no document", stage="launch")]
    elif errors:
        verdict, signatures, unexplained = _error_verdict(errors, causes)
        advisories += [n for n in unexplained if n not in advisories]
    else:
        # Under a non-exact profile (a resume at another DP size reduces in another order) the
        # state after step M is judged against the profile's numeric bound; restored state stays exact.
        final = final_state.findings(profile, baseline_doc, resumed_doc)
        if final and not causes:
            # Restored state matched, yet the runs ended apart: the resumed loop itself differs.
            causes.append(FINAL_STATE_MISMATCH)
            evidence.update(final)
        if not lane["tolerance"]["pass"] and not causes:
            causes.append(LOSS_DIVERGENCE_UNEXPLAINED)
            evidence[LOSS_DIVERGENCE_UNEXPLAINED] = {
                "failing_steps": lane["tolerance"]["failing_steps"],
                "metrics": sorted({m for r in rows for m in r.get("differing_metrics", [])}),
            }
        verdict = FAIL if causes or not lane["tolerance"]["pass"] else PASS
        signatures = causes
    # every state-diff cause names what the resume lost (section, state-dict name, how), once, here
    # (a named known bug and a wrongly applied scalar first: they say why the state items below moved)
    state_lines = lost.annotate(evidence, baseline_doc, resumed_doc)
    cause_lines = {n: line for n, line in {**lost.scalar_cause_lines(evidence), **state_lines}.items()
                   if n in signatures}
    cause_lines.update(_build_crash_lines(errors, signatures))
    if missing:  # evidence the spec requires is absent: whatever the rest says, the run is not judged
        verdict, errors = ERROR, [*missing, *errors]
    worked_around: list[SignatureId] = [n for n in SIGNATURE_IDS if n in hidden]
    by: dict[str, list[SignatureId]] = {}
    for name in worked_around:
        by.setdefault(hidden[name]["by"], []).append(name)
    return parity_result(
        verdict,
        spec.to_dict(),
        errors=errors,
        signatures=signatures,
        verdict_label=str(verdict_label(verdict, by or worked_around,
                                        profile.bound_label() if profile is not None and not profile.exact else None)),
        advisories=advisories,
        worked_around=worked_around,
        worked_around_by=by,
        worked_around_evidence={n: hidden[n]["evidence"] for n in worked_around},
        workarounds_not_needed=not_needed,
        evidence=evidence,
        cause_lines=cause_lines,
        probe_findings=probe_findings(baseline_doc, resumed_doc),
        first_divergent_step=lane["exact"]["first_divergent_step"],
        first_step_beyond_tolerance=lane["tolerance"]["first_step_beyond_tolerance"],
        lanes=lane,
        steps=rows,
        isolation=spec.effective_isolation,
        **reshard_fields(spec, profile, lane["final_state"]),
        probes={
            "train_and_save": None if baseline_doc is None else baseline_doc.get("probes"),
            "resume": None if resumed_doc is None else resumed_doc.get("probes"),
        },
        phases={"train_and_save": _phase_summary(baseline_doc), "resume": _phase_summary(resumed_doc)},
    )
