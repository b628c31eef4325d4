"""Postgres LISTEN/NOTIFY between the API and the scheduler: "a run was queued", sent at commit.

The notification comes from a trigger on `runs` (migration 0008): every INSERT of a queued run
notifies RUNS_CHANNEL with the run id, at no extra round trip for the request. NOTIFY is
transactional: Postgres delivers it when the inserting transaction commits and drops it on
rollback, so a scheduler woken by it always finds the row. Polling stays as the fallback for a
scheduler that missed a notification (not listening yet, or reconnecting after an outage).
"""

from __future__ import annotations

# keep in step with alembic/versions/04_rev0008_notify_queued_runs.py
RUNS_CHANNEL = "parity_runs_queued"
