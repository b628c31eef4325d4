"""Postgres LISTEN/NOTIFY between the API and the scheduler: "a run was queued", sent at commit.

NOTIFY is transactional: Postgres delivers it when the request's transaction commits and drops it
on rollback, so a scheduler woken by it always finds the row. Polling stays as the fallback for a
scheduler that missed a notification (not listening yet, or reconnecting after an outage).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

RUNS_CHANNEL = "parity_runs_queued"


def notify_queued(session: Session, *, run_id: int) -> None:
    """Tell listening schedulers, when this transaction commits, that run_id is queued."""
    session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": RUNS_CHANNEL, "payload": str(run_id)})
