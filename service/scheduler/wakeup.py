"""What the scheduler waits on between ticks: a NOTIFY from the API, a phase's result file, or the clock.

A queued run wakes the loop through Postgres LISTEN/NOTIFY (RUNS_CHANNEL below) within one
NOTIFY round trip; a finished phase wakes it when one of its rank documents appears on disk (a
stat of a few paths every STAT_INTERVAL_S, far cheaper than asking Slurm). Without either event
the loop still ticks every poll interval, so a missed notification or a job that died without
writing anything is only late, never lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from sqlalchemy import make_url

log = logging.getLogger(__name__)
# Postgres LISTEN/NOTIFY between the API and the scheduler: "a run was queued", sent at commit.
#
# The notification comes from a trigger on `runs` (migration 0008): every INSERT of a queued run
# notifies RUNS_CHANNEL with the run id, at no extra round trip for the request. NOTIFY is
# transactional: Postgres delivers it when the inserting transaction commits and drops it on
# rollback, so a scheduler woken by it always finds the row. Polling stays as the fallback for a
# scheduler that missed a notification (not listening yet, or reconnecting after an outage).
# keep in step with alembic/versions/04_rev0008_notify_queued_runs.py
RUNS_CHANNEL = "parity_runs_queued"
STAT_INTERVAL_S = 0.05
RECONNECT_S = 5.0


class Wakeup:
    """Sleep until an event or a timeout; owns the scheduler's LISTEN connection."""

    def __init__(self, database_url: Callable[[], str], stop: threading.Event) -> None:
        self._url = database_url
        self._stop = stop
        self._conn: psycopg.Connection | None = None
        self._next_connect = 0.0

    def _listen(self) -> psycopg.Connection | None:
        if self._conn is None and time.monotonic() >= self._next_connect:
            self._next_connect = time.monotonic() + RECONNECT_S
            try:
                plain = make_url(self._url()).set(drivername="postgresql").render_as_string(hide_password=False)
                conn = psycopg.connect(plain, autocommit=True, connect_timeout=5)
                conn.execute(f"LISTEN {RUNS_CHANNEL}")
                self._conn = conn
            except Exception as exc:  # noqa: BLE001 - polling carries on without notifications
                log.warning("LISTEN %s failed (%s); polling only", RUNS_CHANNEL, str(exc).splitlines()[0])
        return self._conn

    def _notified(self, timeout: float) -> bool:
        conn = self._listen()
        if conn is None:
            self._stop.wait(timeout)
            return False
        try:
            return any(True for _ in conn.notifies(timeout=timeout, stop_after=1))
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", str(exc).splitlines()[0])
            self.close()
            return False

    def wait(self, timeout: float, watch: list[Path] | None = None) -> str:
        """Return "notify", "file", "stop" or "timeout", whichever comes first."""
        deadline = time.monotonic() + timeout
        missing = [p for p in watch or [] if not p.exists()]
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            if self._notified(min(STAT_INTERVAL_S, left)):
                self._drain()
                return "notify"
            if any(p.exists() for p in missing):
                return "file"
        return "stop"

    def _drain(self) -> None:
        # a burst of POSTs is one tick's work: swallow the notifications already delivered
        if self._conn is not None:
            try:
                for _ in self._conn.notifies(timeout=0):
                    pass
            except psycopg.Error:
                self.close()

    def close(self) -> None:
        """Drop the LISTEN connection (reopened on the next wait)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
