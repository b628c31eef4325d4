"""Per check × track × verdict: how many finished runs, and the latest one. Kept by a trigger on runs.

The overview shows, per check and track, the latest verdict and how many runs gave each verdict.
Computed from `runs` that is a scan of the whole history on every page view; this table holds the
answer, maintained by `parity_history_summary()` (alembic 0014) in the same transaction as the
run's verdict, so the overview's cost follows the number of checks × tracks, not of runs. Self-test
runs are left out, as the overview leaves them out.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base


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
