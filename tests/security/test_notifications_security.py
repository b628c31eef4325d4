"""Notifications: Slack text escaped, owners from the token, internal destinations refused, URLs masked,
delivery off the scheduler's pass with no row lock held while a receiver takes its time."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from models import NotificationChannel, OutboxMessage
from models.base import utcnow
from service.core.settings import get_settings
from service.oncall.delivery import deliver_step, slack_body
from service.scheduler.loop import tick
from tests.plugins.server import configure

HOSTILE = "<!channel> <https://evil.example/login|click to re-authenticate> <@U123>"


def test_slack_text_is_escaped_everywhere_a_client_chose_it() -> None:
    body = slack_body({"event": "regression.opened", "title": f"Regression: check on {HOSTILE}",
                       "regression": {"signatures": [HOSTILE], "acknowledged_by": HOSTILE, "note": HOSTILE},
                       "triage_url": "http://svc/runs/1/triage", "run_url": "http://svc/runs/1", "run_id": 1})
    text = body["text"]
    assert "<!channel>" not in text and "<https://evil" not in text and "<@U123>" not in text
    assert text.count("&lt;!channel&gt;") == 4
    # the service's own links are the only markup left
    assert "<http://svc/runs/1/triage|triage>" in text and "<http://svc/runs/1|run 1>" in text
    assert text.count("<") == 2


def test_acknowledge_owner_is_the_token_not_free_text(client: TestClient, make_token) -> None:
    resp = client.post("/api/v1/regressions/1/acknowledge", headers=make_token("submit", name="bob"),
                       json={"who": "alice"})
    assert resp.status_code == 422 and resp.json()["field"] == "who"


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/hook", "http://localhost/hook", "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.5/hook", "http://192.168.1.1/", "http://[::1]/hook", "http://0.0.0.0/", "ftp://93.184.215.14/",
])
def test_internal_destinations_are_refused_by_default(client: TestClient, make_token, monkeypatch, url: str) -> None:
    configure(monkeypatch, PARITY_NOTIFY_ALLOW_PRIVATE="0")
    resp = client.post("/api/v1/notifications/channels", headers=make_token("admin"),
                       json={"name": "probe", "kind": "slack", "url": url})
    assert resp.status_code == 422 and resp.json()["field"] == "url", resp.text


def test_allow_hosts_narrows_destinations(client: TestClient, make_token, monkeypatch) -> None:
    configure(monkeypatch, PARITY_NOTIFY_ALLOW_PRIVATE="0", PARITY_NOTIFY_ALLOW_HOSTS="hooks.slack.com")
    resp = client.post("/api/v1/notifications/channels", headers=make_token("admin"),
                       json={"name": "elsewhere", "kind": "slack", "url": "https://93.184.215.14/x"})
    assert resp.status_code == 422 and "PARITY_NOTIFY_ALLOW_HOSTS" in resp.json()["detail"]


def test_channel_urls_are_masked_in_every_response(client: TestClient, make_token, monkeypatch) -> None:
    configure(monkeypatch, PARITY_NOTIFY_ALLOW_PRIVATE="0")
    admin = make_token("admin")
    secret_path = "/services/T0001/B0002/XXXXsecretXXXX"
    made = client.post("/api/v1/notifications/channels", headers=admin,
                       json={"name": "slack", "kind": "slack", "url": f"https://93.184.215.14{secret_path}"})
    assert made.status_code == 201, made.text
    hook = client.post("/api/v1/notifications/channels", headers=admin, json={
        "name": "hook", "kind": "webhook", "secret": "s" * 20,
        "url": "https://user:pw@93.184.215.14/hook?token=XXXXsecretXXXX"})
    assert hook.status_code == 201, hook.text
    listed = client.get("/api/v1/notifications/channels", headers=admin)
    for text_ in (made.text, hook.text, listed.text):
        assert "XXXXsecretXXXX" not in text_ and "pw@" not in text_ and "s" * 20 not in text_
    assert made.json()["url"] == "https://93.184.215.14/services/…"


class _Slow(BaseHTTPRequestHandler):
    arrived = threading.Event()
    hold_s = 3.0

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Slow.arrived.set()
        time.sleep(_Slow.hold_s)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_slow_receiver_holds_no_lock_and_is_not_in_the_scheduler_pass(committed_db: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = create_engine(committed_db)
    try:
        with Session(engine) as session:
            channel = NotificationChannel(name="slow", kind="webhook", secret="s" * 20, events=[], enabled=True,
                                          url=f"http://127.0.0.1:{server.server_address[1]}/hook")
            session.add(channel)
            session.flush()
            message = OutboxMessage(channel_id=channel.id, event="regression.opened", dedup_key="k1",
                                    payload={"title": "t"}, next_attempt_at=utcnow())
            session.add(message)
            session.commit()
            message_id = message.id
        # 1. the scheduler's pass does not deliver (a due message stays pending after a tick)
        done = tick(get_settings(), executor="local")
        assert "notified" not in done
        with Session(engine) as session:
            assert session.get(OutboxMessage, message_id).state == "pending"  # type: ignore[union-attr]
        # 2. the delivery worker posts holding no transaction: the row can be locked meanwhile
        worker = threading.Thread(target=deliver_step)
        worker.start()
        assert _Slow.arrived.wait(10)
        with engine.connect() as conn:
            try:
                conn.execute(text("SET lock_timeout = '200ms'"))
                conn.execute(text("SELECT id FROM notification_outbox WHERE id = :id FOR UPDATE NOWAIT"),
                             {"id": message_id})
            except OperationalError as exc:
                pytest.fail(f"the outbox row stayed locked while the receiver was slow: {exc}")
            conn.rollback()
        worker.join(30)
        with Session(engine) as session:
            row = session.get(OutboxMessage, message_id)
            assert row is not None and row.state == "delivered" and row.attempts == 1
    finally:
        server.shutdown()
        server.server_close()
        engine.dispose()
