"""Outbox delivery, in its own thread beside the scheduler loop: post due messages, retry with backoff.

A pass claims due messages in one short transaction (SKIP LOCKED, then a lease on next_attempt_at so
replicas never send one message twice), posts them holding no transaction and no row lock, and
records each outcome in another short transaction. A receiver that is slow or down delays only
notifications, never the scheduler's pass (it used to post inside it, 5 s x 20 messages, with the
outbox rows locked). Delivery is at least once: receivers de-duplicate on X-Parity-Delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import NotificationChannel, OutboxMessage
from models.base import utcnow
from service.core.settings import Settings, get_settings
from service.oncall.destinations import BadDestination, check_destination
from service.oncall.notification_events import backoff

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 12
TIMEOUT_S = 5.0
SIGNATURE_HEADER = "X-Parity-Signature"
# how long a claimed message is left alone by other replicas while this one posts it
CLAIM_LEASE = timedelta(seconds=120)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>" with the channel's shared secret, as 'sha256=<hex>'."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def mrkdwn(value: object) -> str:
    """Text for Slack mrkdwn: &, < and > escaped (Slack's own rule), so `<!channel>`, `<@U…>` and
    `<url|label>` in a title, track, owner or note arrive as text, never as a mention or a link."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(url: object, label: object) -> str:
    # the service's own URLs; `|` and `>` would end the link early, so they are escaped as well
    return f"<{mrkdwn(url).replace('|', '%7C')}|{mrkdwn(label).replace('|', '/')}>"


def slack_body(payload: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook message: one line of text with the links Slack renders.

    Every piece of text a client could have chosen (title and track come from labels, owner and note
    from whoever acknowledged) is escaped; only the two links the service builds are markup.
    """
    lines = [f"*{mrkdwn(payload.get('summary') or payload.get('title', payload.get('event')))}*"]
    reg = payload.get("regression") or {}
    if reg.get("signatures"):
        lines.append("signatures: " + ", ".join(f"`{mrkdwn(s)}`" for s in reg["signatures"]))
    for check in payload.get("failing") or []:  # a failed suite run: one line per failing check
        lines.append(f"• {mrkdwn(check.get('check'))}: {mrkdwn((check.get('reading') or {}).get('line', ''))} "
                     f"{_link(check.get('triage_url'), 'triage')}"
                     + (f" · {_link(check['regression_url'], 'regression')}" if check.get("regression_url") else ""))
    if payload.get("suite_run"):
        pipeline = str(payload.get("pipeline_url") or "")
        lines.append(_link(payload["suite_run"]["url"], "suite run")
                     + (f" · {_link(pipeline, 'pipeline')}" if pipeline.startswith(("https://", "http://")) else ""))
        return {"text": "\n".join(lines)}
    if reg.get("acknowledged_by"):
        lines.append(f"owner: {mrkdwn(reg['acknowledged_by'])}"
                     + (f" — {mrkdwn(reg['note'])}" if reg.get("note") else ""))
    if payload.get("triage_url"):
        run_label = f"run {payload.get('run_id')}"
        lines.append(f"{_link(payload['triage_url'], 'triage')} · {_link(payload.get('run_url'), run_label)}")
    return {"text": "\n".join(lines)}


def request_for(channel: NotificationChannel, message: OutboxMessage) -> tuple[bytes, dict[str, str]]:
    """The body and headers posted for one message on one channel."""
    document = slack_body(message.payload) if channel.kind == "slack" else message.payload
    body = json.dumps(document, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "X-Parity-Event": message.event,
               # receivers de-duplicate on this (a retry after a lost 200 carries the same id)
               "X-Parity-Delivery": f"{message.id}:{message.dedup_key}"}
    if channel.secret:
        timestamp = str(int(time.time()))
        headers["X-Parity-Timestamp"] = timestamp
        headers[SIGNATURE_HEADER] = sign(channel.secret, timestamp, body)
    return body, headers


@dataclass(frozen=True)
class Outgoing:
    """One claimed message, ready to post without any database row or transaction held."""

    message_id: int
    channel: str
    url: str
    body: bytes
    headers: dict[str, str]


def claim_due(session: Session, *, limit: int = 20, now: datetime | None = None) -> list[Outgoing]:
    """Take up to limit due messages: lock them briefly (SKIP LOCKED) and lease them for CLAIM_LEASE.

    The lease (next_attempt_at moved forward) is what keeps another replica off them once this
    transaction commits, so no row lock is held while a receiver takes its time. A message whose
    channel is gone or disabled is marked dead here.
    """
    now = now or utcnow()
    due = session.scalars(
        select(OutboxMessage)
        .where(OutboxMessage.state == "pending", OutboxMessage.next_attempt_at <= now)
        .order_by(OutboxMessage.id).limit(limit).with_for_update(skip_locked=True)
    ).all()
    out = []
    for message in due:
        channel = session.get(NotificationChannel, message.channel_id)
        if channel is None or not channel.enabled:
            message.state, message.last_error = "dead", "channel removed or disabled"
            continue
        body, headers = request_for(channel, message)
        message.next_attempt_at = utcnow() + CLAIM_LEASE
        out.append(Outgoing(message.id, channel.name, channel.url, body, headers))
    session.flush()
    return out


def post(outgoing: Outgoing, http: httpx.Client, settings: Settings) -> tuple[bool, str]:
    """POST one message (destination checked again: a name may resolve elsewhere now); -> (ok, error)."""
    try:
        check_destination(outgoing.url, settings)
    except BadDestination as exc:
        return False, f"destination refused: {exc}"
    try:
        response = http.post(outgoing.url, content=outgoing.body, headers=outgoing.headers)
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return response.is_success, f"HTTP {response.status_code}: {response.text[:200]}"


def record(session: Session, outgoing: Outgoing, ok: bool, error: str) -> bool:
    """Store the outcome of one post: delivered, or retried with backoff, or dead after MAX_ATTEMPTS."""
    message = session.get(OutboxMessage, outgoing.message_id)
    if message is None or message.state != "pending":
        return False  # the channel was deleted meanwhile
    message.attempts += 1
    if ok:
        message.state, message.delivered_at, message.last_error = "delivered", utcnow(), None
        return True
    message.last_error = error[:2000]
    if message.attempts >= MAX_ATTEMPTS:
        message.state = "dead"
        log.error("notification %s to %s given up after %d attempts: %s",
                  message.id, outgoing.channel, message.attempts, error)
    else:
        message.next_attempt_at = utcnow() + backoff(message.attempts)
        log.warning("notification %s to %s failed (%s); attempt %d", message.id, outgoing.channel, error,
                    message.attempts)
    return False


def deliver_due(
    session: Session, *, limit: int = 20, client: httpx.Client | None = None, now: datetime | None = None
) -> int:
    """Post up to limit messages due at now, all in the caller's transaction; -> how many were delivered.

    For callers that own one transaction (tests, one-off tools); the scheduler uses deliver_step,
    which holds no transaction while it posts.
    """
    claimed = claim_due(session, limit=limit, now=now)
    if not claimed:
        return 0
    settings = get_settings()
    http = client or httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    try:
        return sum(record(session, o, *post(o, http, settings)) for o in claimed)
    finally:
        if client is None:
            http.close()


def deliver_step(limit: int = 20, client: httpx.Client | None = None) -> int:
    """One delivery pass of the delivery worker: claim (short transaction), post (none), record (short)."""
    from service.core.db import session_scope

    with session_scope() as session:
        claimed = claim_due(session, limit=limit)
    if not claimed:
        return 0
    settings = get_settings()
    http = client or httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    try:
        results = [(o, *post(o, http, settings)) for o in claimed]
    finally:
        if client is None:
            http.close()
    with session_scope() as session:
        return sum(record(session, o, ok, error) for o, ok, error in results)


class DeliveryWorker(threading.Thread):
    """The scheduler's delivery thread: a slow or dead receiver delays notifications, never a run."""

    def __init__(self, stop: threading.Event, interval_s: float = 2.0) -> None:
        super().__init__(name="notification-delivery", daemon=True)
        self.stop, self.interval_s = stop, interval_s

    def run(self) -> None:
        """Deliver until stop is set; a failed pass (database outage) is logged and tried again."""
        while not self.stop.is_set():
            try:
                busy = deliver_step() > 0
            except Exception as exc:  # never let the thread die: the next pass retries
                log.warning("notification delivery pass failed: %s", exc)
                busy = False
            self.stop.wait(0 if busy else self.interval_s)
