"""`parity submit --summary FILE`: Markdown for $GITHUB_STEP_SUMMARY or an MR note, one line per check."""

from __future__ import annotations

from typing import Any

from jobs.verdict_names import GOOD
from service.cli.client.junit import ADVISORY, reading_of


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _line(name: str, run: dict[str, Any]) -> str:
    read = reading_of(run)
    verdict = f"**{read['label']}**" if run.get("verdict") not in GOOD or run.get("regression") \
        else read["label"]
    cause = "; ".join(p for p in (read["cause"], read["bound"]) if p) or "—"
    return (f"| {_cell(name)} | {_cell(verdict)} | {_cell(read['step'] or '—')} | {_cell(cause)} | "
            f"[triage]({run['links']['triage']}) |")


HEADER = ["| check | verdict | step | cause | link |", "|---|---|---|---|---|"]


def run_summary(run: dict[str, Any], *, outcome: str) -> str:
    """The summary of one run."""
    title = f"### Resume parity: {run['check_name']} on {run['environment']} — **{outcome}**"
    return "\n".join([title, "", *HEADER, _line(run["config"], run), "", f"_{ADVISORY[0].upper()}{ADVISORY[1:]}._",
                      ""]) + "\n"


def suite_summary(view: dict[str, Any], *, outcome: str) -> str:
    """The summary of a suite run: its verdict and counts, then one table line per check."""
    counts = ", ".join(f"{n} {k}" for k, n in view["counts"].items() if n)
    title = (f"### Resume parity: suite {view['suite']} v{view['version']} on {view['environment']} — "
             f"**{outcome}** ({counts}) · [suite run]({view['links']['dashboard']})")
    return "\n".join([title, "", *HEADER, *(_line(c["name"], c["run"]) for c in view["checks"]), "",
                      f"_{ADVISORY[0].upper()}{ADVISORY[1:]}._", ""]) + "\n"
