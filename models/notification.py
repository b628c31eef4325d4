"""Notification channels (admin-configured) and the outbox that delivers their messages at least once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class NotificationChannel(CreatedAt, Base):
    __tablename__ = "notification_channels"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # webhook: generic JSON with an HMAC-SHA256 signature header; slack: incoming-webhook payload
    kind: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(String(2000))
    # the shared HMAC secret; stored because signing needs it, never returned by the API
    secret: Mapped[str | None] = mapped_column(String(500))
    # which events go to this channel; empty means all
    events: Mapped[list[str]] = mapped_column(JSONB, default=list)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)


class OutboxMessage(CreatedAt, Base):
    __tablename__ = "notification_outbox"
    __table_args__ = (
        # the de-duplication record: one message per channel per event of one regression
        UniqueConstraint("channel_id", "dedup_key", name="uq_notification_outbox_channel_dedup"),
        Index("ix_notification_outbox_due", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    channel_id: Mapped[int] = mapped_column(ForeignKey("notification_channels.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    dedup_key: Mapped[str] = mapped_column(String(300))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    # pending -> delivered | dead (gave up after the last retry)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None]
