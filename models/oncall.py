"""What watches the history: regressions, known failures, notification channels and their outbox, tracks
and the history summary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt, utcnow
from models.jsonsafe import SafeText


# A regression as an object: opened when a check fails on a track where it last passed, closed by a pass.
class Regression(CreatedAt, Base):
    __tablename__ = "regressions"
    __table_args__ = (
        # at most one unresolved regression per check × track: a second failing run joins it
        Index("uq_regressions_unresolved", "check_key", "track", unique=True,
              postgresql_where=text("state <> 'resolved'")),
        Index("ix_regressions_state", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    check_key: Mapped[str] = mapped_column(String(16))
    check_name: Mapped[str] = mapped_column(String(500))
    config: Mapped[str] = mapped_column(String(100))
    track: Mapped[str] = mapped_column(String(200))
    # the track whose last pass this failure broke (the own track, or the base track of a new branch)
    compared_track: Mapped[str] = mapped_column(String(200))
    # open -> acknowledged -> resolved (open -> resolved when fixed before anyone acknowledged)
    state: Mapped[str] = mapped_column(String(16), default="open")
    first_failing_run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    last_good_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    latest_failing_run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    # every failing run while open, oldest first (first_failing_run_id included)
    failing_run_ids: Mapped[list[int]] = mapped_column(JSONB, default=list)
    signatures: Mapped[list[str]] = mapped_column(JSONB, default=list)
    acknowledged_by: Mapped[str | None] = mapped_column(String(200))
    acknowledged_at: Mapped[datetime | None]
    note: Mapped[str | None] = mapped_column(SafeText)
    upstream_url: Mapped[str | None] = mapped_column(String(1000))
    resolved_at: Mapped[datetime | None]
    fixed_by_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    # a regression on a source's track: the bisect over its commits, and the first bad commit it named
    bisect_id: Mapped[str | None] = mapped_column(String(12))
    first_bad_commit: Mapped[str | None] = mapped_column(String(64))
    first_bad_subject: Mapped[str | None] = mapped_column(String(500))


# Each change of a regression's state, as run_events records a run's (service/oncall/regression_state.py).
class RegressionEvent(Base):
    __tablename__ = "regression_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(SafeText, default="")
    at: Mapped[datetime] = mapped_column(default=utcnow)


# Known upstream bugs: on these environments (names or a Megatron-Core version range), signature S is known.
class KnownFailure(CreatedAt, Base):
    __tablename__ = "known_failures"

    id: Mapped[int] = mapped_column(primary_key=True)
    signature: Mapped[str] = mapped_column(String(100), index=True)
    # environment names it applies to; empty = any environment whose build matches mcore_versions
    environments: Mapped[list[str]] = mapped_column(JSONB, default=list)
    # a PEP 440 specifier set on the Megatron-Core version, e.g. "<=0.16.1"; empty = any version
    mcore_versions: Mapped[str] = mapped_column(String(200), default="")
    link: Mapped[str] = mapped_column(String(1000))
    note: Mapped[str] = mapped_column(SafeText, default="")
    created_by: Mapped[str | None] = mapped_column(String(200))
    retired_at: Mapped[datetime | None]


# Notification channels (admin-configured) and the outbox that delivers their messages at least once.
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
    last_error: Mapped[str | None] = mapped_column(SafeText)
    delivered_at: Mapped[datetime | None]


# A track: a suite run on a source's latest commit, on demand and every `every_seconds` (label track=<name>).
#
# `next_run_at` is when the scheduler runs it next (a `parity track run` sets it to now); the runs it
# queues are labelled branch=<name>, track=<name>, commit=<sha>, so their history is the track's own.
class Track(CreatedAt, Base):
    __tablename__ = "tracks"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    source_id: Mapped[int] = mapped_column(ForeignKey("sources.id"), index=True)
    suite: Mapped[str] = mapped_column(String(100))
    every_seconds: Mapped[int]
    # a check going pass -> fail between two commits starts a bisect over the commits between
    auto_bisect: Mapped[bool] = mapped_column(Boolean, default=False)
    next_run_at: Mapped[datetime]
    last_run_at: Mapped[datetime | None]
    last_commit: Mapped[str | None] = mapped_column(String(64))
    last_suite_run_id: Mapped[str | None] = mapped_column(String(12))
    last_error: Mapped[str | None] = mapped_column(String(2000))
    created_by: Mapped[str | None] = mapped_column(String(200))


# Per check × track × verdict: how many finished runs, and the latest one. Kept by a trigger on runs.
#
# The overview shows, per check and track, the latest verdict and how many runs gave each verdict.
# Computed from `runs` that is a scan of the whole history on every page view; this table holds the
# answer, maintained by `parity_history_summary()` (alembic 0014) in the same transaction as the
# run's verdict, so the overview's cost follows the number of checks × tracks, not of runs. Self-test
# runs are left out, as the overview leaves them out.
class HistorySummary(Base):
    __tablename__ = "history_summary"

    check_key: Mapped[str] = mapped_column(String(16), primary_key=True)
    track: Mapped[str] = mapped_column(String(200), primary_key=True)
    verdict: Mapped[str] = mapped_column(String(16), primary_key=True)
    runs: Mapped[int] = mapped_column(Integer)
    # the latest run with this verdict (finished_at, then id, as the overview orders them)
    # no foreign key: the trigger keeps it right when a run is deleted (an ON DELETE CASCADE would
    # drop the counts with the row)
    latest_run_id: Mapped[int | None] = mapped_column(Integer)
    latest_finished_at: Mapped[datetime | None]
