"""A pull request that breaks several checks of a suite: one regression group, one alert naming the PR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Environment, OutboxMessage, Regression, Run
from service.core.run_state import RunState
from service.core.settings import get_settings
from service.oncall.delivery import deliver_due, slack_body
from service.oncall.suite_alerts import on_check_ended
from service.runs.import_check import fail_runs_on_failed_builds
from service.runs.lifecycle import transition
from service.runs.records import cancel_run
from service.scheduler.row_guard import per_row
from service.scheduler.submitter import new_phase, retry_or_give_up
from tests.plugins.verdict_helpers import finish
from tests.plugins.webhook_receiver import start_receiver

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"dp": 2, "steps": 6, "save_step": 3}
SUITE = {"name": "gate", "checks": [
    {"name": "dp2-dense", "spec": {"config": "dense-bf16", **SPEC}},
    {"name": "dp2-moe", "spec": {"config": "moe-fp32-router", **SPEC}},
    {"name": "layerwise", "spec": {"config": "layerwise-empty-rank", **SPEC}},
]}
PR = {"branch": "pr-7", "base_branch": "main", "commit": "abc1234", "pipeline_url": "https://ci.example.com/p/77"}


@pytest.fixture
def receiver():
    r = start_receiver()
    yield r
    r.stop()


def _suite_run(client: TestClient, submit: dict[str, str], labels: dict[str, str]) -> dict[str, int]:
    view = client.post("/api/v1/suite-runs", json={"suite": "gate", "labels": labels}, headers=submit).json()
    return {c["name"]: c["run"]["id"] for c in view["checks"]} | {"_id": view["id"]}  # type: ignore[dict-item]


def test_a_failing_suite_run_sends_one_alert_naming_the_pr(
    client: TestClient, db_session: Session, make_token, receiver
) -> None:
    admin, submit = make_token("admin"), make_token("submit", name="ci")
    assert client.post("/api/v1/notifications/channels", headers=admin, json={
        "name": "oncall", "kind": "webhook", "url": receiver.url + "/hook", "secret": "s3cret-shared-with-the-receiver",
        "events": ["regression.opened"]}).status_code == 201  # subscribed before suite alerts existed
    client.post("/api/v1/suites", json=SUITE, headers=admin)
    main = _suite_run(client, submit, {"branch": "main"})
    for name in ("dp2-dense", "dp2-moe", "layerwise"):
        finish(db_session, main[name], "pass")
    pr = _suite_run(client, submit, PR)
    finish(db_session, pr["dp2-dense"], "fail", ["lr-schedule-mismatch"], first_divergent_step=4)
    assert db_session.scalar(select(OutboxMessage)) is None  # nothing until the suite run's last check
    finish(db_session, pr["dp2-moe"], "fail", ["optimizer-index-misalignment"])
    finish(db_session, pr["layerwise"], "pass")

    messages = db_session.scalars(select(OutboxMessage)).all()
    assert [m.event for m in messages] == ["suite-run.failed"]  # one alert, no per-check regression.opened
    regs = db_session.scalars(select(Regression).order_by(Regression.id)).all()
    assert [(r.track, r.compared_track, r.state) for r in regs] == [("pr-7", "main", "open")] * 2  # still opened
    payload = messages[0].payload
    assert payload["pr"] == PR and payload["pipeline_url"] == PR["pipeline_url"]
    assert payload["summary"] == (
        "Suite gate failed on pr-7 (commit abc1234): 2 of 3 checks fail — dp2-dense: fail (regression against main); "
        "dp2-moe: fail (regression against main)")
    assert [(f["check"], f["regression_id"]) for f in payload["failing"]] == [
        ("dp2-dense", regs[0].id), ("dp2-moe", regs[1].id)]
    assert payload["failing"][0]["reading"]["cause"] == "Learning rate differs after resume (lr-schedule-mismatch)"
    assert payload["suite_run"]["url"].endswith(f"/suite-runs/{pr['_id']}")

    assert deliver_due(db_session) == 1 and len(receiver.got) == 1
    assert receiver.got[0].headers["x-parity-event"] == "suite-run.failed"
    assert json.loads(receiver.got[0].body)["failing"][1]["check"] == "dp2-moe"
    slack = slack_body(payload)["text"].splitlines()
    assert slack[0] == f"*{payload['summary']}*"
    assert slack[1].startswith("• dp2-dense: fail (regression against main) — Learning rate differs after resume "
                               "(lr-schedule-mismatch); first divergent step 4 <http")
    assert slack[-1].endswith("|suite run> · <https://ci.example.com/p/77|pipeline>")

    view = client.get(f"/api/v1/suite-runs/{pr['_id']}").json()
    assert [c["regression"] and c["regression"]["id"] for c in view["checks"]] == [regs[0].id, regs[1].id, None]
    page = client.get(f"/suite-runs/{pr['_id']}").text
    assert f'href="/regressions/{regs[0].id}"' in page
    link = '<a class="pipeline-link" href="https://ci.example.com/p/77" rel="noopener noreferrer">pipeline</a>'
    assert link in page and link in client.get(f"/runs/{pr['dp2-dense']}").text  # pipeline_url is a link
    assert f'href="/suite-runs/{pr["_id"]}"' in client.get(f"/regressions/{regs[0].id}").text  # linked both ways


def test_a_lone_run_still_alerts_per_check(client: TestClient, db_session: Session, make_token, receiver) -> None:
    admin, submit = make_token("admin"), make_token("submit")
    assert client.post("/api/v1/notifications/channels", headers=admin, json={
        "name": "oncall", "kind": "webhook", "url": receiver.url + "/hook",
        "secret": "s3cret-shared-with-the-receiver"}).status_code == 201
    ids = [client.post("/api/v1/runs", json={"spec": {"config": "dense-bf16", **SPEC}, "labels": {"branch": "main"}},
                       headers=submit).json()["id"] for _ in range(2)]
    finish(db_session, ids[0], "pass")
    finish(db_session, ids[1], "fail", ["lr-schedule-mismatch"], first_divergent_step=4)
    messages = db_session.scalars(select(OutboxMessage)).all()
    assert [m.event for m in messages] == ["regression.opened"]
    # the webhook's words are the run's reading, as on every other surface
    assert messages[0].payload["summary"].endswith(
        " — fail (regression on main) — Learning rate differs after resume (lr-schedule-mismatch); "
        "first divergent step 4")
    assert messages[0].payload["cause"] == "Learning rate differs after resume (lr-schedule-mismatch)"


def test_only_an_http_pipeline_url_becomes_a_link(client: TestClient, make_token) -> None:
    run = client.post("/api/v1/runs", json={"spec": {"config": "dense-bf16", **SPEC},
                                            "labels": {"pipeline_url": "javascript:alert(1)"}},
                      headers=make_token("submit")).json()
    page = client.get(f"/runs/{run['id']}").text
    assert "pipeline_url=javascript:alert(1)" in page and "pipeline-link" not in page


def _end_by_verdict(session: Session, run: Run) -> None:
    finish(session, run.id, "pass")


def _end_by_submitter_give_up(session: Session, run: Run) -> None:
    settings = get_settings()
    transition(session, run, RunState.TRAIN_SUBMITTED, "test")
    phase = new_phase(session, run=run, name="train_and_save", attempt=settings.max_infra_retries + 1,
                      settings=settings, executor="local")
    retry_or_give_up(session, phase=phase, run=run, what="node lost", settings=settings, executor="local")
    session.commit()


def _end_by_row_guard_give_up(session: Session, run: Run) -> None:
    def broken() -> None:
        raise ValueError("a row the scheduler cannot handle")

    for _ in range(get_settings().max_row_failures):
        assert per_row(session, run, broken, settings=get_settings(), what="evaluation") is False
        session.commit()


def _end_by_failed_build(session: Session, run: Run) -> None:
    env = session.get(Environment, run.environment_id)
    assert env is not None
    env.state, env.error_message = "failed", "pip: no matching distribution"
    assert fail_runs_on_failed_builds(session) == 1
    session.commit()


def _end_by_cancel(session: Session, run: Run) -> None:
    cancel_run(session, run_id=run.id)
    session.commit()


ENDINGS = {"verdict": _end_by_verdict, "submitter-give-up": _end_by_submitter_give_up,
           "row-guard-give-up": _end_by_row_guard_give_up, "failed-build": _end_by_failed_build,
           "cancel": _end_by_cancel}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_suite_alerts_once_however_its_last_check_ends(
    client: TestClient, db_session: Session, make_token, ending: str
) -> None:
    # the path that ends the run calls no alert: entering a final state runs the lifecycle's handlers
    admin, submit = make_token("admin"), make_token("submit", name="ci")
    client.post("/api/v1/notifications/channels", headers=admin, json={
        "name": "oncall", "kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret": "s3cret-shared-with-the-rx"})
    client.post("/api/v1/suites", json=SUITE, headers=admin)
    main = _suite_run(client, submit, {"branch": "main"})
    for name in ("dp2-dense", "dp2-moe", "layerwise"):
        finish(db_session, main[name], "pass")
    pr = _suite_run(client, submit, PR)
    finish(db_session, pr["dp2-dense"], "fail", ["lr-schedule-mismatch"])  # the regressed check, judged first
    finish(db_session, pr["dp2-moe"], "pass")
    assert db_session.scalar(select(OutboxMessage)) is None
    last = db_session.get(Run, pr["layerwise"])
    assert last is not None
    ENDINGS[ending](db_session, last)
    db_session.refresh(last)
    assert last.state in {"passed", "error", "cancelled"}
    assert [m.event for m in db_session.scalars(select(OutboxMessage))] == ["suite-run.failed"]
    assert on_check_ended(db_session, last) is True  # run again: the same message, not a second one
    db_session.commit()
    assert len(db_session.scalars(select(OutboxMessage)).all()) == 1


def test_only_the_lifecycle_applies_a_run_transition() -> None:
    # a module that moved runs itself would skip the final states' handlers
    callers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "service").rglob("*.py")
                     if "apply_transition" in p.read_text() and p.name not in ("run_state.py", "lifecycle.py"))
    assert callers == []
