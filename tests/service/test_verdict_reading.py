"""One reading of a verdict on every surface: a golden per surface (CLI, JUnit, Markdown, the suite, run and triage
pages, webhook, Slack), all rendered from service/core/verdicts.reading."""

from __future__ import annotations

import html
from types import SimpleNamespace
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from models import Run
from service.cli.client.ci_report import suite_junit_xml, suite_summary
from service.cli.client.submit import report
from service.cli.client.suite import check_line
from service.core.verdicts import clip, reading
from service.oncall.delivery import slack_body
from service.oncall.notification_events import summary_line

CRASH = ("RuntimeError: the resume phase could not load the distributed optimizer state because the checkpoint "
         "metadata names a parameter group that the rebuilt model does not have at all, see the log for the shard")
RESHARD_BOUND = {"name": "reshard:moe-fp32-router:2->1", "description": "calibrated", "loss_rtol": 3e-05,
                 "loss_atol": 0.0, "lr_rtol": 0.0, "lr_atol": 1e-12, "metrics_rtol": 0.000583, "state_rtol": 0.0}
SPEC = {"dp": 2, "steps": 6, "save_step": 3}
SUITE = {"name": "read", "checks": [
    {"name": "worked-around", "spec": {"config": "moe-fp32-router", **SPEC, "workarounds": ["realign-param-index"]}},
    {"name": "lr-regression", "spec": {"config": "dense-bf16", **SPEC}},
    {"name": "reshard", "spec": {"config": "moe-fp32-router", **SPEC, "resume_dp": 1}},
    {"name": "crash", "spec": {"config": "layerwise-empty-rank", **SPEC}},
]}
OUTCOMES: dict[str, dict[str, Any]] = {
    "worked-around": {"state": "passed", "verdict": "pass", "summary": {
        "worked_around_by": {"realign-param-index": ["optimizer-index-misalignment"]}, "lanes": {"compared_steps": 3}}},
    "lr-regression": {"state": "failed", "verdict": "fail", "signatures": ["lr-schedule-mismatch"],
                      "first_divergent_step": 4, "regression": True, "track": "pr-7", "compared_track": "main",
                      "summary": {"lanes": {"compared_steps": 3}}},
    "reshard": {"state": "passed", "verdict": "pass", "first_divergent_step": 4, "max_abs_loss_delta": 2.1e-5,
                "summary": {"reshard": {"bound": RESHARD_BOUND}, "measured": {"loss_rel": 7.4e-06},
                            "lanes": {"compared_steps": 3}}},
    "crash": {"state": "error", "verdict": "error", "error_message": CRASH},
}
LINES = {
    "worked-around": "pass (worked around: realign-param-index) — no divergent step",
    "lr-regression": "fail (regression against main) — Learning rate differs after resume (lr-schedule-mismatch); "
                     "first divergent step 4",
    "reshard": "pass (within the calibrated reshard bound) — first divergent step 4; max relative loss delta 7.4e-06 "
               "within the calibrated reshard bound 3e-05, 25% of it",
    "crash": "error — RuntimeError: the resume phase could not load the distributed optimizer state because the "
             "checkpoint metadata names a parameter group that the rebuilt model does not have at all, see the log "
             "for the…",
}


@pytest.fixture
def suite_run(client: TestClient, make_token, db_session: Session) -> dict[str, Any]:
    """A finished suite run of the four cases, as GET /api/v1/suite-runs/{id} answers."""
    assert client.post("/api/v1/suites", json=SUITE, headers=make_token("admin")).status_code == 201
    view = client.post("/api/v1/suite-runs", json={"suite": "read", "labels": {"branch": "pr-7"}},
                       headers=make_token("submit", name="ci")).json()
    for check in view["checks"]:
        db_session.execute(update(Run).where(Run.id == check["run"]["id"]).values(**OUTCOMES[check["name"]]))
    return dict(client.get(f"/api/v1/suite-runs/{view['id']}").json())


def test_the_reading_of_each_case(suite_run: dict[str, Any]) -> None:
    assert {c["name"]: c["run"]["reading"]["line"] for c in suite_run["checks"]} == LINES
    assert all(c["run"]["verdict_label"] == c["run"]["reading"]["label"] for c in suite_run["checks"])
    assert clip("realign param index", 12) == "realign…" and "None" not in "".join(LINES.values())


def test_cli_suite_table(suite_run: dict[str, Any]) -> None:
    for check in suite_run["checks"]:
        assert check_line(check) == f"{check['name']:<28} {LINES[check['name']]}  {check['run']['links']['triage']}"


def test_cli_single_check(suite_run: dict[str, Any], capsys) -> None:
    class NoMetrics:
        def get(self, _path: str) -> Any:
            return SimpleNamespace(is_success=True, status_code=200, json=lambda: {"steps": []})

    run = next(c["run"] for c in suite_run["checks"] if c["name"] == "lr-regression")
    assert report(NoMetrics(), run, timed_out=False, junit=None) == 1  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines()[0] == f"verdict: {LINES['lr-regression']}"


def test_junit(suite_run: dict[str, Any]) -> None:
    cases = {c.get("name"): c for c in ET.fromstring(suite_junit_xml(suite_run, timed_out=False)).findall("testcase")}
    failure = cases["lr-regression"].find("failure")
    assert failure is not None
    assert failure.get("message") == "Learning rate differs after resume (lr-schedule-mismatch)"
    run_id = next(c["run"]["id"] for c in suite_run["checks"] if c["name"] == "lr-regression")
    assert failure.text == (
        f"run {run_id} (failed): fail (regression against main)\n"
        "cause: Learning rate differs after resume (lr-schedule-mismatch)\n"
        "step: first divergent step 4\n"
        f"triage: http://testserver/runs/{run_id}/triage")
    out = cases["reshard"].find("system-out")
    assert out is not None and "bound: max relative loss delta 7.4e-06 within the calibrated reshard bound 3e-05, " \
        "25% of it" in (out.text or "")


def test_markdown_summary(suite_run: dict[str, Any]) -> None:
    rows = {line.split(" | ")[0][2:]: line for line in suite_summary(suite_run, outcome="fail").splitlines()
            if line.startswith("| ") and not line.startswith("| check")}
    assert rows["lr-regression"].startswith(
        "| lr-regression | **fail (regression against main)** | first divergent step 4 | "
        "Learning rate differs after resume (lr-schedule-mismatch) | [triage](")
    assert rows["reshard"].startswith(
        "| reshard | pass (within the calibrated reshard bound) | first divergent step 4 | max relative loss delta "
        "7.4e-06 within the calibrated reshard bound 3e-05, 25% of it | [triage](")
    assert rows["worked-around"].startswith(
        "| worked-around | pass (worked around: realign-param-index) | no divergent step | — |")


def test_suite_page(client: TestClient, suite_run: dict[str, Any]) -> None:
    page = html.unescape(client.get(f"/suite-runs/{suite_run['id']}").text)
    assert ">fail (regression against main)</span></td>\n    <td>first divergent step 4</td>\n    " \
        "<td>Learning rate differs after resume (lr-schedule-mismatch)</td>" in page
    assert ">pass (within the calibrated reshard bound)</span></td>\n    <td>first divergent step 4</td>\n    " \
        "<td>max relative loss delta 7.4e-06 within the calibrated reshard bound 3e-05, 25% of it</td>" in page
    assert ">pass (worked around: realign-param-index)</span>" in page


def _reading_paragraph(text: str) -> str:
    start = text.index('<p id="reading"')
    return " ".join(html.unescape(text[start:text.index("</p>", start)]).split())


@pytest.mark.parametrize("page", ["", "/triage"])
def test_run_and_triage_pages(client: TestClient, suite_run: dict[str, Any], page: str) -> None:
    run_id = next(c["run"]["id"] for c in suite_run["checks"] if c["name"] == "lr-regression")
    text = client.get(f"/runs/{run_id}{page}").text
    assert _reading_paragraph(text).split(">", 1)[1].startswith(
        "fail (regression against main): <span class=\"reading\">Learning rate differs after resume "
        "(lr-schedule-mismatch); first divergent step 4</span>.")
    assert ">fail (regression against main)</span>" in html.unescape(text)  # the heading's badge


def test_triage_says_the_step_where_the_signature_says_some_step(client: TestClient, suite_run: dict[str, Any]) -> None:
    run_id = next(c["run"]["id"] for c in suite_run["checks"] if c["name"] == "lr-regression")
    text = html.unescape(client.get(f"/runs/{run_id}/triage").text)
    assert "than the uninterrupted run from step 4 on: the scheduler state" in text and "at some step" not in text


def test_run_page_of_a_worked_around_pass(client: TestClient, suite_run: dict[str, Any]) -> None:
    run_id = next(c["run"]["id"] for c in suite_run["checks"] if c["name"] == "worked-around")
    para = _reading_paragraph(client.get(f"/runs/{run_id}").text)
    assert para.split(">", 1)[1] == ("pass (worked around: realign-param-index): <span class=\"reading\">no divergent "
                                     "step</span>. Workaround <code>realign-param-index</code> hid "
                                     "<code>optimizer-index-misalignment</code> .")


def _facts(run: dict[str, Any]) -> dict[str, Any]:
    return {"environment": "pr-build", "commit": "abc123", "reading": run["reading"],
            "verdict": run["reading"]["label"]}


def test_webhook_and_slack(suite_run: dict[str, Any]) -> None:
    run = next(c["run"] for c in suite_run["checks"] if c["name"] == "lr-regression")
    reg = SimpleNamespace(check_name="dense-bf16 dp2", track="pr-7", compared_track="main", signatures=[])
    line = summary_line("regression.opened", reg, _facts(run))  # type: ignore[arg-type]
    assert line == ("Regression against main: dense-bf16 dp2 on pr-7 (environment pr-build, commit abc123) — "
                    f"{LINES['lr-regression']}")
    slack = slack_body({"summary": line, "triage_url": run["links"]["triage"], "run_id": run["id"],
                        "run_url": run["links"]["dashboard"]})
    assert slack["text"].splitlines()[0] == f"*{line}*"
    assert reading({**run, "summary": OUTCOMES["lr-regression"]["summary"]}).line() == LINES["lr-regression"]


def test_a_tolerance_judged_run_records_what_its_bound_is_read_against(
    client: TestClient, make_token, db_session: Session
) -> None:
    from tests.plugins.verdict_helpers import finish

    def row(step: int, rel: float, resumed: bool = True) -> dict[str, Any]:
        return {"step": step, "resumed_phase": resumed, "loss_baseline": 4.0, "loss_resumed": 4.0 * (1 + rel),
                "loss_abs_delta": 4.0 * rel, "loss_rel_delta": rel, "lr_baseline": 1e-3, "lr_resumed": 1e-3,
                "lr_abs_delta": 0.0, "lr_rel_delta": 0.0, "within_tolerance": True}

    run = client.post("/api/v1/runs", json={"spec": {"config": "moe-fp32-router", **SPEC, "resume_dp": 1}},
                      headers=make_token("submit")).json()
    stored = finish(db_session, run["id"], "pass", steps=[row(3, 1e-3, resumed=False), row(4, 2e-6), row(5, -7e-6)],
                    first_divergent_step=4, reshard={"bound": RESHARD_BOUND})
    assert stored.summary["measured"] == {"loss_rel": 7e-6}  # the resumed steps only
    assert reading(stored).bound == "max relative loss delta 7e-06 within the calibrated reshard bound 3e-05, 23% of it"
