"""Judge the state after step M against the tolerance profile (pure).

Under `exact` any fingerprint difference is a finding. Under any other profile the discrete
sections (steps, groups, scheduler, iteration, rng) must still be identical, ranks must hold the
same replica (`ranks-differ` in the global view), and each numeric section (model, main, moments)
must stay within the profile's bound on the largest relative L2 distance of one item, read from
the resume's `state_final_deltas` probe. Numeric differences with no measurement to bound them
are a finding, never a pass.
"""

from __future__ import annotations

import math
from typing import Any

from jobs.contract import STATE_FINAL, STATE_FINAL_DELTAS, PhaseDocument
from jobs.signature_names import FINAL_STATE_MISMATCH
from jobs.tolerance import NUMERIC_STATE_SECTIONS, ToleranceProfile
from jobs.verdict.state_diff import snapshot_diffs, summarise

RANKS_DIFFER = "ranks-differ("


def _probes(doc: PhaseDocument | None) -> dict[str, Any]:
    return dict((doc.get("probes") or {}) if doc else {})


def _num(v: Any) -> float:
    return math.inf if v in ("inf", None) else float(v)


def _section_deltas(resumed: PhaseDocument | None) -> tuple[dict[str, Any] | None, str | None]:
    probe = _probes(resumed).get(STATE_FINAL_DELTAS)
    if not probe:
        return None, "the resume measured no numeric distance to the saving run's final state"
    if "error" in probe:
        return None, str(probe["error"])
    return probe["sections"], None


def lane(profile: ToleranceProfile, resumed: PhaseDocument | None) -> dict[str, Any]:
    """The final-state lane as the result shows it: each numeric section's distance and its bound."""
    sections, why = _section_deltas(resumed)
    out: dict[str, Any] = {"profile": profile.name, "exact_required": profile.exact}
    if sections is None:
        return {**out, "measured": False, "reason": why}
    rows = {
        s: {**sections[s], "bound": b, "within": _num(sections[s]["max_rel"]) <= b}
        for s in NUMERIC_STATE_SECTIONS
        if s in sections and (b := profile.state_bound(s)) is not None
    }
    return {**out, "measured": True, "sections": rows, "pass": all(r["within"] for r in rows.values())}


def findings(
    profile: ToleranceProfile, baseline: PhaseDocument | None, resumed: PhaseDocument | None
) -> dict[str, Any]:
    """{"final-state-mismatch": evidence} when the final states differ beyond the profile, else {}."""
    diffs = snapshot_diffs(_probes(baseline).get(STATE_FINAL), _probes(resumed).get(STATE_FINAL))
    if not diffs:
        return {}
    flat = [{"section": s, **d} for s, items in diffs.items() for d in items]
    if profile.exact:
        return {FINAL_STATE_MISMATCH: summarise(flat, sections=sorted(diffs))}
    # what no tolerance covers: discrete sections, and a replica a rank holds differently from the others
    strict = [
        d for d in flat
        if d["section"] not in NUMERIC_STATE_SECTIONS or any(RANKS_DIFFER in str(d[k]) for k in ("before", "after"))
    ]
    numeric = {d["section"] for d in flat if d["section"] in NUMERIC_STATE_SECTIONS}
    sections, why = _section_deltas(resumed)
    beyond: dict[str, Any] = {}
    for s in sorted(numeric):
        got = (sections or {}).get(s)
        if got is None:
            beyond[s] = {"bound": profile.state_bound(s), "max_rel": None, "reason": why}
        elif _num(got["max_rel"]) > profile.state_bound(s):
            beyond[s] = {"bound": profile.state_bound(s), **got}
    if not strict and not beyond:
        return {}
    shown = strict or [d for d in flat if d["section"] in beyond]
    return {
        FINAL_STATE_MISMATCH: summarise(
            shown,
            sections=sorted({d["section"] for d in strict} | set(beyond)),
            profile=profile.name,
            beyond_bound=beyond,
            differing_exactly=sorted({d["section"] for d in strict}),
        )
    }
