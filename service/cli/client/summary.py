"""`parity submit --summary FILE`: Markdown for $GITHUB_STEP_SUMMARY or an MR note, one line per check."""

from __future__ import annotations

from typing import Any

from service.cli.client.junit import ADVISORY


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _cause(run: dict[str, Any]) -> str:
    if run.get("signatures"):
        return ", ".join(f"`{s}`" for s in run["signatures"])
    if run.get("error_message"):
        return _cell(str(run["error_message"]).strip().splitlines()[0][:200])
    return "—"


def _verdict(run: dict[str, Any]) -> str:
    verdict = run.get("verdict_label") or run.get("verdict") or run.get("state")
    if run.get("regression"):
        verdict = f"{verdict} (regression{': ' + run['regression_text'] if run.get('regression_text') else ''})"
    return f"**{verdict}**" if run.get("verdict") not in ("pass", "known-failure") else str(verdict)


def _line(name: str, run: dict[str, Any]) -> str:
    step = run.get("first_divergent_step")
    return (f"| {_cell(name)} | {_cell(_verdict(run))} | {step if step is not None else '—'} | {_cause(run)} | "
            f"[triage]({run['links']['triage']}) |")


HEADER = ["| check | verdict | first divergent step | cause | link |", "|---|---|---|---|---|"]


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
