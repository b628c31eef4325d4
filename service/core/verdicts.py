"""How a run's verdict reads, everywhere: the one function every surface renders from.

The CLI table, JUnit, the Markdown summary, the suite/run/triage pages, webhooks and Slack all show
`reading(run)` (the API carries it as `reading`, so the client renders the service's words): the label
with its qualifiers, the cause as a sentence plus its slug, the first divergent step, and for a
tolerance-judged check the measured value against its bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from jobs.verdict.signatures import SIGNATURES
from jobs.verdict_label import label, qualifiers
from jobs.verdict_names import BROKEN, KNOWN_FAILURE, PASS

ERROR_CHARS = 200


def run_label(run: Any) -> str:
    """The label every surface shows (run, config, overview and triage pages, API, CLI, notifications): the
    verdict (or state) with every qualifier, of a Run, a row selecting the columns reading() reads, or an API
    document."""
    return reading(run).label


def clip(text: str, limit: int) -> str:
    """text cut to at most limit characters at a word boundary, with an ellipsis when cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(",;:") + "…"


def cause_sentence(slug: str) -> str:
    """A signature as a sentence plus its slug: 'Learning rate differs after resume (lr-schedule-mismatch)'."""
    sig = SIGNATURES.get(slug)  # type: ignore[call-overload]
    return f"{sig.title} ({slug})" if sig else slug


@dataclass(frozen=True)
class Reading:
    """A verdict as people read it."""

    label: str  # "pass (worked around: realign-param-index)", "fail (regression against main)", "running"
    cause: str  # "Learning rate differs after resume (lr-schedule-mismatch)"; "" when nothing is wrong
    step: str  # "first divergent step 4", "no divergent step", "not compared: …"
    bound: str  # tolerance-judged checks: "max relative loss delta 7.4e-06 within the bound 3.0e-05 (…)"; else ""
    slugs: tuple[str, ...] = ()

    def line(self) -> str:
        """label — cause; step; bound (the parts that say something)."""
        rest = "; ".join(p for p in (self.cause, self.step, self.bound) if p)
        return f"{self.label} — {rest}" if rest else self.label

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the API (`reading`) and notifications."""
        return {**asdict(self), "slugs": list(self.slugs), "line": self.line()}


def _get(run: Any, name: str) -> Any:
    return run.get(name) if isinstance(run, Mapping) else getattr(run, name, None)


def _qualifiers(run: Any, summary: dict[str, Any]) -> list[str]:
    verdict = _get(run, "verdict")
    profile = _profile(summary)
    known = [k.get("signature") for k in summary.get("known_failures") or [] if k.get("signature")]
    return qualifiers(
        verdict, worked_around_by=summary.get("worked_around_by") or summary.get("worked_around"),
        known_signatures=known if verdict == KNOWN_FAILURE else (),
        within=_bound_name(profile) if profile is not None and _get(run, "first_divergent_step") is not None
        else None,
        regression=(_get(run, "track"), _get(run, "compared_track")) if _get(run, "regression") else None)


def _step(run: Any, summary: dict[str, Any]) -> str:
    step = _get(run, "first_divergent_step")
    if step is not None:
        return f"first divergent step {step}"
    if _get(run, "verdict") not in (PASS, *BROKEN):
        return ""  # still running, or ended in an error before there was anything to compare
    lanes = summary.get("lanes") or {}
    if lanes and not lanes.get("compared_steps"):
        return "no step compared (the resume did not run)"
    return "no divergent step"


def _profile(summary: dict[str, Any]) -> dict[str, Any] | None:
    reshard = summary.get("reshard") or {}
    profile = reshard.get("bound") or ((summary.get("lanes") or {}).get("tolerance") or {}).get("profile")
    if not isinstance(profile, dict):
        return None
    bounds = [profile.get(k) or 0.0 for k in ("loss_rtol", "loss_atol", "lr_rtol", "lr_atol", "metrics_rtol",
                                               "state_rtol")]
    exact = not any(bounds) and not profile.get("state_rtol_by_section") \
        and not profile.get("allow_failing_fraction")
    return None if exact else profile


def _bound_name(profile: dict[str, Any]) -> str:
    name = str(profile.get("name") or "tolerance")
    return "the calibrated reshard bound" if name.startswith("reshard") else f"the {name} bound"


def _bound(run: Any, summary: dict[str, Any]) -> str:
    profile = _profile(summary)
    if profile is None or _get(run, "verdict") is None:
        return ""
    what = _bound_name(profile)
    rtol = float(profile.get("loss_rtol") or 0.0)
    measured = (summary.get("measured") or {}).get("loss_rel")
    beyond = _get(run, "first_step_beyond_tolerance")
    if measured is None:
        absolute = _get(run, "max_abs_loss_delta")
        seen = f"max |Δloss| {absolute:.2g}" if absolute is not None else "loss"
        verdict = f"beyond {what} (loss rtol {rtol:.2g}) from step {beyond}" if beyond is not None \
            else f"within {what} (loss rtol {rtol:.2g})"
        return f"{seen} {verdict}"
    share = f", {measured / rtol:.0%} of it" if rtol else ""
    if beyond is not None:
        return f"max relative loss delta {measured:.2g} beyond {what} {rtol:.2g} from step {beyond}"
    return f"max relative loss delta {measured:.2g} within {what} {rtol:.2g}{share}"


def reading(run: Any) -> Reading:
    """How run's verdict reads (a Run row, a stored row or an API document with `summary`)."""
    summary = _get(run, "summary") or {}
    verdict = _get(run, "verdict")
    state = _get(run, "state")
    base = verdict or ("error" if state == "error" else state or "unknown")
    if verdict is None and state == "cancelled":
        base = "cancelled"
    shown = label(str(base), _qualifiers(run, summary))
    slugs = tuple(_get(run, "signatures") or ())
    # a state-diff cause's line, made once by the verdict (jobs/verdict/causes.py), names what was lost
    found = summary.get("cause_lines")
    lines: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if slugs:
        cause = "; ".join(str(lines.get(s) or cause_sentence(s)) for s in slugs)
    elif _get(run, "error_message") and verdict != PASS:
        cause = clip(str(_get(run, "error_message")).strip().splitlines()[0], ERROR_CHARS)
    else:
        cause = ""
    return Reading(label=shown, cause=cause, step=_step(run, summary), bound=_bound(run, summary), slugs=slugs)
