"""What a CI job reads of a run or a suite run: the reading of a run, JUnit XML for `parity submit --junit`
(a test case per run, per check of a suite, failures with the triage link) and Markdown for
`parity submit --summary FILE` ($GITHUB_STEP_SUMMARY or an MR note, one line per check)."""

from __future__ import annotations

import sys
from typing import Any
from xml.etree import ElementTree as ET

from jobs.verdict_label import label as qualified
from jobs.verdict_names import BROKEN, GOOD, KNOWN_FAILURE, PASS
from service.core.state_names import FINISHED_RUN_STATES

# what a pass on code nobody reviewed is worth (docs/security.md): said wherever a verdict is handed on
ADVISORY = ("a pass is advisory when the build is untrusted: its code runs inside the ranks and can write its own "
            "results (docs/security.md)")


# The service's reading of a run (`reading` in every run document): what each client surface prints.
#
# The words come from the service (service/core/verdicts.reading), so the CLI, JUnit and the Markdown
# summary say what the pages and alerts say, and a new signature needs no new client.
def exit_code_of(answer: dict[str, Any], *, timed_out: bool, strict: bool) -> int:
    """The exit code the server computed for a run or a suite run (its `outcome`), with or without --strict; 2 if
    the wait ended first (the client's one fact of its own)."""
    if timed_out:
        return 2
    outcome = answer.get("outcome")
    if not isinstance(outcome, dict):  # a service older than this client: it cannot say, so neither can we
        print("parity submit: the service sent no outcome (is it older than this client?); exit 2", file=sys.stderr)
        return 2
    return int(outcome["exit_code_strict" if strict else "exit_code"])


def reading_of(run: dict[str, Any]) -> dict[str, Any]:
    """run["reading"]; from an older service, the verdict (or state) alone."""
    found = run.get("reading")
    if isinstance(found, dict) and found.get("label"):
        return found
    label = qualified(str(run.get("verdict_label") or run.get("verdict") or run.get("state") or "unknown"),
                      [run.get("regression_text") or ""])
    return {"label": label, "cause": ", ".join(run.get("signatures") or []), "step": "", "bound": "", "slugs": [],
            "line": label}


def _case(suite: ET.Element, run: dict[str, Any], *, name: str, classname: str, timed_out: bool,
          strict: bool, fails_on_base: str | None = None) -> str:
    """Add one test case for run; returns its outcome (error | skipped | failure | pass)."""
    case = ET.SubElement(suite, "testcase", classname=classname, name=name)
    verdict = run.get("verdict")
    read = reading_of(run)
    text = "\n".join([f"run {run['id']} ({run['state']}): {read['label']}",
                      *(f"{k}: {read[k]}" for k in ("cause", "step", "bound") if read.get(k)),
                      f"triage: {run['links']['triage']}"])
    finished = run.get("state") in FINISHED_RUN_STATES
    # the server's result for the check (service/core/outcome.py); from an older service, the verdict alone
    result = str((run.get("outcome") or {}).get("result") or "")
    if timed_out and not finished:
        ET.SubElement(case, "error", message="timed out waiting for a verdict").text = text
        outcome = "error"
    elif fails_on_base or result == "fails-on-base":  # the base branch fails it too: not the pull request's failure
        ET.SubElement(case, "skipped", message=fails_on_base or "fails on the base track too").text = text
        outcome = "skipped"
    elif (result or verdict) == KNOWN_FAILURE and not strict:
        known = ", ".join(f"{k['signature']} ({k['link']})" for k in run.get("known_failures") or [])
        ET.SubElement(case, "skipped", message=f"known upstream failure: {known or '-'}").text = text
        outcome = "skipped"
    elif result == "fail" or verdict in BROKEN or run.get("regression"):
        ET.SubElement(case, "failure", message=read["cause"] or read["label"]).text = text
        outcome = "failure"
    elif verdict != PASS:
        ET.SubElement(case, "error", message=read["cause"] or read["label"]).text = text
        outcome = "error"
    else:
        outcome = "pass"
    ET.SubElement(case, "system-out").text = text
    return outcome


def _count(suite: ET.Element, outcomes: list[str]) -> None:
    suite.set("tests", str(len(outcomes)))
    for key, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        if outcomes.count(key):
            suite.set(attr, str(outcomes.count(key)))


def junit_xml(run: dict[str, Any], *, timed_out: bool, strict: bool = False) -> bytes:
    """A JUnit document describing one parity run."""
    suite = ET.Element("testsuite", name="megatron-resume-parity", tests="1")
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="advisory", value=ADVISORY)
    outcome = _case(suite, run, name=f"resume-parity[{run['config']}]", classname="parity", timed_out=timed_out,
                    strict=strict)
    _count(suite, [outcome])
    return ET.tostring(suite, xml_declaration=True, encoding="utf-8")


def suite_junit_xml(view: dict[str, Any], *, timed_out: bool, strict: bool = False) -> bytes:
    """A JUnit document for a suite run: one test case per check, named by the check."""
    suite = ET.Element("testsuite", name=f"megatron-resume-parity[{view['suite']}]")
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="suite_run", value=view["links"]["dashboard"])
    ET.SubElement(properties, "property", name="advisory", value=ADVISORY)
    outcomes = [_case(suite, c["run"], name=c["name"], classname=f"parity.{view['suite']}", timed_out=timed_out,
                      strict=strict, fails_on_base=c.get("fails_on_base")) for c in view["checks"]]
    _count(suite, outcomes)
    return ET.tostring(suite, xml_declaration=True, encoding="utf-8")


# Markdown: the --summary file
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
