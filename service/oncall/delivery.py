"""Outbox delivery, one small step of the scheduler loop: post due messages, retry with backoff.

Rows are locked with SKIP LOCKED while posting, so scheduler replicas never send one message twice;
a receiver that is down only delays a message (attempts and the error are kept on the row).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import NotificationChannel, OutboxMessage
from models.base import utcnow
from service.oncall.notification_events import backoff

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 12
TIMEOUT_S = 5.0
SIGNATURE_HEADER = "X-Parity-Signature"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>" with the channel's shared secret, as 'sha256=<hex>'."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def slack_body(payload: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook message: one line of text with the links Slack renders."""
    lines = [f"*{payload.get('summary') or payload.get('title', payload.get('event'))}*"]
    reg = payload.get("regression") or {}
    if reg.get("signatures"):
        lines.append("signatures: " + ", ".join(f"`{s}`" for s in reg["signatures"]))
    if reg.get("acknowledged_by"):
        lines.append(f"owner: {reg['acknowledged_by']}" + (f" — {reg['note']}" if reg.get("note") else ""))
    if payload.get("triage_url"):
        lines.append(f"<{payload['triage_url']}|triage> · <{payload.get('run_url')}|run {payload.get('run_id')}>")
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


def deliver_due(
    session: Session, *, limit: int = 20, client: httpx.Client | None = None, now: datetime | None = None
) -> int:
    """Post up to limit messages due at now (default: the current time); -> how many were delivered."""
    now = now or utcnow()
    due = session.scalars(
        select(OutboxMessage)
        .where(OutboxMessage.state == "pending", OutboxMessage.next_attempt_at <= now)
        .order_by(OutboxMessage.id).limit(limit).with_for_update(skip_locked=True)
    ).all()
    if not due:
        return 0
    delivered = 0
    own = client is None
    http = client or httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    try:
        for message in due:
            channel = session.get(NotificationChannel, message.channel_id)
            if channel is None or not channel.enabled:
                message.state, message.last_error = "dead", "channel removed or disabled"
                continue
            message.attempts += 1
            try:
                body, headers = request_for(channel, message)
                response = http.post(channel.url, content=body, headers=headers)
                ok, error = response.is_success, f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            if ok:
                message.state, message.delivered_at, message.last_error = "delivered", utcnow(), None
                delivered += 1
                continue
            message.last_error = error[:2000]
            if message.attempts >= MAX_ATTEMPTS:
                message.state = "dead"
                log.error("notification %s to %s given up after %d attempts: %s",
                          message.id, channel.name, message.attempts, error)
            else:
                message.next_attempt_at = utcnow() + backoff(message.attempts)
                log.warning("notification %s to %s failed (%s); attempt %d", message.id, channel.name, error,
                            message.attempts)
    finally:
        if own:
            http.close()
    return delivered


def deliver_step(limit: int = 20) -> int:
    """The scheduler loop's delivery step: one transaction, up to limit messages."""
    from service.core.db import session_scope

    with session_scope() as session:
        return deliver_due(session, limit=limit)
