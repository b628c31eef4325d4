"""A bisect: which environment of an ordered list first fails a check. Its steps are its runs.

The row keeps only the question (the check's spec, the ordered environments) and the answer once
known; each step is a run labelled `bisect=<id>` or a stored verdict of the same check on that
environment, so the state is always derivable from the runs (service/bisects/search.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt, utcnow


class Bisect(CreatedAt, Base):
    __tablename__ = "bisects"

    # 12 hex digits, like a sweep id: what the runs' `bisect` label carries
    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    check_key: Mapped[str] = mapped_column(String(16), index=True)
    check_name: Mapped[str] = mapped_column(String(500))
    # environment names, oldest (known good) first, known bad last
    environments: Mapped[list[str]] = mapped_column(JSONB)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    requester: Mapped[str | None] = mapped_column(String(200))
    # running | found | error: a cache of what the runs say, rewritten on every advance
    state: Mapped[str] = mapped_column(String(16), default="running")
    first_bad: Mapped[str | None] = mapped_column(String(200))
    error_message: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    # a bisect over a source's commits: its environments are built when a step needs them, named by
    # commit; `commits` holds [{"sha", "subject", "date"}] in the order of `environments`
    source: Mapped[str | None] = mapped_column(String(100))
    commits: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
