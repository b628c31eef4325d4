"""The service's reading of a run (`reading` in every run document): what each client surface prints.

The words come from the service (service/core/verdicts.reading), so the CLI, JUnit and the Markdown
summary say what the pages and alerts say, and a new signature needs no new client.
"""

from __future__ import annotations

from typing import Any

from jobs.verdict_label import label as qualified


def reading_of(run: dict[str, Any]) -> dict[str, Any]:
    """run["reading"]; from an older service, the verdict (or state) alone."""
    found = run.get("reading")
    if isinstance(found, dict) and found.get("label"):
        return found
    label = qualified(str(run.get("verdict_label") or run.get("verdict") or run.get("state") or "unknown"),
                      [run.get("regression_text") or ""])
    return {"label": label, "cause": ", ".join(run.get("signatures") or []), "step": "", "bound": "", "slugs": [],
            "line": label}
