"""The one verdict label of a run, used by every emitter (API, CLI, JUnit, dashboard, notifications)."""

from __future__ import annotations

from typing import Any

from jobs.verdict.compare import verdict_label


def label_of(verdict: str | None, summary: dict[str, Any] | None) -> str | None:
    """`pass (worked around: …)` for a pass a workaround made, else the verdict itself."""
    summary = summary or {}
    return verdict_label(verdict, summary.get("worked_around_by") or summary.get("worked_around"))


def run_label(run: Any) -> str | None:
    """The label of a Run row (or anything with verdict and summary)."""
    return label_of(getattr(run, "verdict", None), getattr(run, "summary", None))
