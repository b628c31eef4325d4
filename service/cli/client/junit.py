"""JUnit XML for `parity submit --junit`: one test case per run, failures carrying the triage link."""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET


def junit_xml(run: dict[str, Any], *, timed_out: bool, strict: bool = False) -> bytes:
    """A JUnit document describing one parity run."""
    name = f"resume-parity[{run['config']}]"
    suite = ET.Element("testsuite", name="megatron-resume-parity", tests="1")
    case = ET.SubElement(suite, "testcase", classname="parity", name=name)
    verdict = run.get("verdict")
    text = (
        f"run {run['id']}: state {run['state']}, verdict {run.get('verdict_label') or verdict},"
        f" signatures {', '.join(run['signatures']) or '-'},"
        f" first divergent step {run.get('first_divergent_step')}"
        + (f", {run['regression_text']}" if run.get("regression_text") else "")
        + f"\ntriage: {run['links']['triage']}"
    )
    if timed_out:
        ET.SubElement(case, "error", message="timed out waiting for a verdict").text = text
        suite.set("errors", "1")
    elif verdict == "known-failure" and not strict:
        known = ", ".join(f"{k['signature']} ({k['link']})" for k in run.get("known_failures") or [])
        ET.SubElement(case, "skipped", message=f"known upstream failure: {known or '-'}").text = text
        suite.set("skipped", "1")
    elif verdict in ("fail", "known-failure") or run.get("regression"):
        ET.SubElement(case, "failure", message=", ".join(run["signatures"]) or "parity failure").text = text
        suite.set("failures", "1")
    elif verdict != "pass":
        ET.SubElement(case, "error", message=run.get("error_message") or f"verdict {verdict}").text = text
        suite.set("errors", "1")
    ET.SubElement(case, "system-out").text = text
    return ET.tostring(suite, xml_declaration=True, encoding="utf-8")
