"""How a verdict reads as a label, composed in one place: `pass (worked around: realign-param-index)`,
`known-failure (known upstream bug: adam-step-not-restored)`, `fail (regression against main)`.

The job's own label (the parity result's `verdict_label`, run-local's printout) and the service's
`reading(run).label` (every page, the CLI, JUnit, the Markdown summary, commit statuses, webhooks and
Slack) are both built here; tests/jobs/test_verdict_label.py finds a qualifier spelled anywhere else.
Stdlib only: the base client install imports it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jobs.verdict_names import KNOWN_FAILURE, PASS

WORKED_AROUND = "worked around"


def qualifiers(verdict: str | None, *, worked_around_by: Mapping[str, Any] | Sequence[Any] | None = None,
               known_signatures: Sequence[str] = (), within: str | None = None,
               regression: tuple[str | None, str | None] | None = None) -> list[str]:
    """What qualifies a verdict, in the order a label shows it.

    `worked_around_by` is {workaround: [signatures]} (a bare list of hidden signatures, from older
    summaries, reads `worked around`); `within` names the bound a pass that diverged stayed within;
    `regression` is (track, compared track) of a run flagged a regression."""
    out = []
    if verdict == PASS and worked_around_by:
        by = worked_around_by
        out.append(f"{WORKED_AROUND}: {', '.join(sorted(by))}" if isinstance(by, Mapping) else WORKED_AROUND)
    if verdict == KNOWN_FAILURE:
        known = list(known_signatures)
        out.append(f"known upstream bug: {', '.join(known)}" if known else "known upstream bug")
    if verdict == PASS and within:
        out.append(f"within {within}")
    if regression is not None:
        out.append(regression_qualifier(*regression))
    return out


def regression_qualifier(track: str | None, compared: str | None) -> str:
    """A flagged run: a regression on its own track, or against the base track it was compared with."""
    return f"regression against {compared}" if compared and compared != track \
        else f"regression on {track}" if track else "regression"


def label(base: str, qualified_by: Iterable[str] = ()) -> str:
    """`base (q1; q2)`: a verdict (or state) and what qualifies it; base alone when nothing does."""
    parts = [q for q in qualified_by if q]
    return f"{base} ({'; '.join(parts)})" if parts else base


def verdict_label(verdict: str | None, worked_around_by: Mapping[str, Any] | Sequence[Any] | None,
                  bound: str | None = None) -> str | None:
    """The job's label of its verdict: a pass that needed a workaround to hide a finding is `pass (worked
    around: <workarounds>)`, never a plain pass; `bound` (a non-exact profile's bounds) follows in brackets."""
    if verdict is None:
        return None
    text = label(verdict, qualifiers(verdict, worked_around_by=worked_around_by))
    return f"{text} [{bound}]" if bound else text
