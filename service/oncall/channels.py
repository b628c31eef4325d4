"""Notification channels: what an admin configures through the API (never commits)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import NotificationChannel, OutboxMessage
from service.core.errors import Conflict, InvalidSpec, NotFound
from service.core.settings import get_settings
from service.oncall.destinations import BadDestination, check_destination
from service.oncall.notification_events import EVENTS

KINDS = ("webhook", "slack")


def create_channel(session: Session, *, name: str, kind: str, url: str, secret: str | None,
                   events: list[str]) -> NotificationChannel:
    """Add a channel; bad kind, URL or event names are 422s that list the allowed values."""
    if kind not in KINDS:
        raise InvalidSpec(f"kind: unknown {kind!r}; allowed: {', '.join(KINDS)}", field="kind")
    unknown = sorted(set(events) - set(EVENTS))
    if unknown:
        raise InvalidSpec(f"events: unknown {', '.join(unknown)}; allowed: {', '.join(EVENTS)}", field="events")
    if kind == "webhook" and not secret:
        raise InvalidSpec("secret: a webhook channel needs a shared secret to sign its messages", field="secret")
    try:
        check_destination(url, get_settings())
    except BadDestination as exc:
        raise InvalidSpec(f"url: {exc}", field="url") from None
    if session.scalar(select(NotificationChannel.id).where(NotificationChannel.name == name)) is not None:
        raise Conflict(f"name: a channel named {name!r} already exists", field="name")
    channel = NotificationChannel(name=name, kind=kind, url=url, secret=secret or None, events=sorted(set(events)),
                                  enabled=True)
    session.add(channel)
    session.flush()
    return channel


def list_channels(session: Session) -> list[tuple[NotificationChannel, dict[str, int]]]:
    """Every channel with its outbox counts by state."""
    channels = list(session.scalars(select(NotificationChannel).order_by(NotificationChannel.id)))
    counts: dict[int, dict[str, int]] = {}
    for channel_id, state, n in session.execute(
        select(OutboxMessage.channel_id, OutboxMessage.state, func.count())
        .group_by(OutboxMessage.channel_id, OutboxMessage.state)
    ).tuples():
        counts.setdefault(channel_id, {})[state] = n
    return [(c, counts.get(c.id, {})) for c in channels]


def delete_channel(session: Session, channel_id: int) -> None:
    """Remove a channel and its undelivered messages."""
    channel = session.get(NotificationChannel, channel_id)
    if channel is None:
        raise NotFound(f"notification channel {channel_id} does not exist", field="channel_id")
    session.delete(channel)
    session.flush()
