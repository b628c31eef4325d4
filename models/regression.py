"""A regression as an object: opened when a check fails on a track where it last passed, closed by a pass."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


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
    note: Mapped[str | None] = mapped_column(Text)
    upstream_url: Mapped[str | None] = mapped_column(String(1000))
    resolved_at: Mapped[datetime | None]
    fixed_by_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    # a regression on a source's track: the bisect over its commits, and the first bad commit it named
    bisect_id: Mapped[str | None] = mapped_column(String(12))
    first_bad_commit: Mapped[str | None] = mapped_column(String(64))
    first_bad_subject: Mapped[str | None] = mapped_column(String(500))
