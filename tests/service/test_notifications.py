"""Notifications through the outbox to a real HTTP receiver on loopback: delivery, signature, retry, de-duplication."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import OutboxMessage
from models.base import utcnow
from service.oncall.delivery import SIGNATURE_HEADER, deliver_due
from tests.plugins.scheduler_harness import free_port
from tests.plugins.verdict_helpers import finish
from tests.plugins.webhook_receiver import start_receiver

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4}
SECRET = "s3cret-shared-with-the-receiver"


@pytest.fixture
def receiver():
    r = start_receiver()
    yield r
    r.stop()


def _channel(client: TestClient, admin: dict[str, str], url: str, **extra) -> dict:
    body = {"name": extra.pop("name", "oncall-hook"), "kind": "webhook", "url": url, "secret": SECRET, **extra}
    resp = client.post("/api/v1/notifications/channels", json=body, headers=admin)
    assert resp.status_code == 201, resp.text
    return resp.json()


def _run(client: TestClient, db: Session, submit: dict[str, str], verdict: str) -> int:
    run = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"branch": "main"}}, headers=submit).json()
    finish(db, run["id"], verdict, ["optimizer-index-misalignment"] if verdict == "fail" else [])
    return run["id"]


def test_one_signed_message_per_regression_with_a_triage_link(
    client: TestClient, db_session: Session, make_token, receiver
) -> None:
    admin, submit = make_token("admin"), make_token("submit")
    channel = _channel(client, admin, receiver.url + "/hook")
    assert "secret" not in channel and channel["signed"] is True
    _run(client, db_session, submit, "pass")
    first_bad = _run(client, db_session, submit, "fail")
    for _ in range(5):  # a storm of failures on the same check and track: still one regression, one message
        _run(client, db_session, submit, "fail")
    assert deliver_due(db_session) == 1
    assert deliver_due(db_session) == 0  # nothing left: delivered messages are never sent again
    assert len(receiver.got) == 1
    got = receiver.got[0]
    assert got.path == "/hook" and got.headers["x-parity-event"] == "regression.opened"
    expected = "sha256=" + hmac.new(SECRET.encode(), got.headers["x-parity-timestamp"].encode() + b"." + got.body,
                                    hashlib.sha256).hexdigest()
    assert got.headers[SIGNATURE_HEADER.lower()] == expected
    assert got.json["triage_url"] == f"http://testserver/runs/{first_bad}/triage"
    reg = client.get("/api/v1/regressions", params={"state": "open"}).json()
    assert len(reg) == 1 and len(reg[0]["failing_run_ids"]) == 6
    assert got.json["regression"]["id"] == reg[0]["id"]
    # acknowledge and resolve: one message each
    ack = client.post(f"/api/v1/regressions/{reg[0]['id']}/acknowledge", json={"note": "mine"}, headers=submit)
    assert ack.status_code == 200 and ack.json()["state"] == "acknowledged"
    fixed = _run(client, db_session, submit, "pass")
    assert deliver_due(db_session) == 2
    events = [r.headers["x-parity-event"] for r in receiver.got]
    assert events == ["regression.opened", "regression.acknowledged", "regression.resolved"]
    assert receiver.got[-1].json["regression"]["fixed_by_run_id"] == fixed
    listed = client.get("/api/v1/notifications/channels", headers=admin).json()
    assert listed[0]["outbox"] == {"delivered": 3}


def test_receiver_down_then_up_gets_the_message_once(client: TestClient, db_session: Session, make_token) -> None:
    port = free_port()
    admin, submit = make_token("admin"), make_token("submit")
    _channel(client, admin, f"http://127.0.0.1:{port}/hook", name="flaky")
    _run(client, db_session, submit, "pass")
    _run(client, db_session, submit, "fail")
    assert deliver_due(db_session) == 0  # connection refused: kept, retried later
    message = db_session.scalar(select(OutboxMessage))
    assert message is not None and message.state == "pending" and message.attempts == 1
    assert "ConnectError" in (message.last_error or "")
    assert message.next_attempt_at > utcnow()  # backoff: not retried at once
    assert deliver_due(db_session) == 0 and message.attempts == 1
    receiver = start_receiver(port)
    try:
        receiver.status = 503  # up but failing: still a retry, with the status recorded
        assert deliver_due(db_session, now=utcnow() + timedelta(hours=1)) == 0
        assert message.attempts == 2 and "HTTP 503" in (message.last_error or "")
        receiver.status = 200
        assert deliver_due(db_session, now=utcnow() + timedelta(hours=2)) == 1
        assert message.state == "delivered" and message.attempts == 3
        assert len(receiver.got) == 2
        # the retry carries the same delivery id, so a receiver can drop a duplicate it already acted on
        assert receiver.got[0].headers["x-parity-delivery"] == receiver.got[1].headers["x-parity-delivery"]
    finally:
        receiver.stop()


def test_slack_channel_gets_an_incoming_webhook_payload(
    client: TestClient, db_session: Session, make_token, receiver
) -> None:
    admin, submit = make_token("admin"), make_token("submit")
    _channel(client, admin, receiver.url + "/slack", name="slack", kind="slack", secret=None,
             events=["regression.opened"])
    _run(client, db_session, submit, "pass")
    bad = _run(client, db_session, submit, "fail")
    assert deliver_due(db_session) == 1
    text = receiver.got[0].json["text"]
    assert set(receiver.got[0].json) == {"text"}
    assert f"<http://testserver/runs/{bad}/triage|triage>" in text and "`optimizer-index-misalignment`" in text


def test_channel_input_is_validated(client: TestClient, make_token) -> None:
    admin = make_token("admin")
    bad_kind = client.post("/api/v1/notifications/channels", json={"name": "x", "kind": "email", "url": "http://a"},
                           headers=admin)
    assert bad_kind.status_code == 422 and "webhook, slack" in bad_kind.json()["detail"]
    no_secret = client.post("/api/v1/notifications/channels", json={"name": "x", "kind": "webhook", "url": "http://a"},
                            headers=admin)
    assert no_secret.status_code == 422 and no_secret.json()["field"] == "secret"
    bad_event = client.post("/api/v1/notifications/channels", headers=admin, json={
        "name": "x", "kind": "slack", "url": "http://a", "events": ["run.done"]})
    assert bad_event.status_code == 422 and "regression.opened" in bad_event.json()["detail"]
    assert client.get("/api/v1/notifications/channels", headers=make_token("submit")).status_code == 403


def test_the_same_event_is_enqueued_once(client: TestClient, db_session: Session, make_token, receiver) -> None:
    from service.oncall.notification_events import enqueue

    _channel(client, make_token("admin"), receiver.url + "/hook")
    assert enqueue(db_session, "regression.opened", "regression-99-regression.opened", {"event": "x"}) == 1
    assert enqueue(db_session, "regression.opened", "regression-99-regression.opened", {"event": "x"}) == 0
    assert deliver_due(db_session) == 1 and len(receiver.got) == 1
