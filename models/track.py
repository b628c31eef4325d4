"""A track: a suite run on a source's latest commit, on demand and every `every_seconds` (label track=<name>).

`next_run_at` is when the scheduler runs it next (a `parity track run` sets it to now); the runs it
queues are labelled branch=<name>, track=<name>, commit=<sha>, so their history is the track's own.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


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
