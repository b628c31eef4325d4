"""Group commit for POST /runs: concurrent requests' runs written by one statement and one commit.

Every queued run fires the `runs_notify_queued` trigger (alembic 0008), and Postgres serialises the
commits of transactions that NOTIFY (one lock on the notification queue, held through the commit's
WAL flush). One run per transaction therefore capped POST /runs at one WAL flush per run (~6 ms
here, ~170 runs/s) however many cores served it. Here each API process has one writer thread:
requests hand it their row and wait; it takes every row waiting (up to MAX_BATCH), inserts them in
one statement on an autocommit connection, and hands each request its row after the commit. A
lone request is written at once (no timer); under load a batch forms while the previous one commits.

Durability is unchanged: a request gets its row only after the statement that inserted it has
committed. A batch the database refused is retried row by row, so one bad row fails only its own
request. A batch whose connection broke, or that could not get one, is not sent again: whether a
statement committed before its connection broke is not knowable, and sending it again could queue
runs twice; every request of it answers 503 (the client may send it again with its Idempotency-Key).
SQLAlchemy's disconnect handling renews the pool when a connection breaks under the statement.
The statement itself is records.insert_batch: this module knows batches, not runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

log = logging.getLogger(__name__)

MAX_BATCH = 64
IDLE_S = 5.0  # a writer with nothing to do for this long ends; the next request starts another
# A lost connection (maybe committed), no connection at all, no pooled connection free: row by row
# would either queue runs twice or fail each row alike, one connect timeout after another.
NOT_SENT_AGAIN = (OperationalError, InterfaceError, PoolTimeout)

Row = Any
WriteBatch = Callable[[Connection, list[dict[str, Any]]], list[Row]]


class _Writer:
    def __init__(self, engine: Engine, write: WriteBatch):
        self.engine, self.write = engine, write
        self.pending: list[tuple[dict[str, Any], Future[Row]]] = []
        self.cv = threading.Condition()
        self.thread: threading.Thread | None = None

    def submit(self, item: dict[str, Any]) -> Row:
        future: Future[Row] = Future()
        with self.cv:
            self.pending.append((item, future))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="parity-group-commit", daemon=True)
                self.thread.start()
            self.cv.notify()
        return future.result()

    def _run(self) -> None:
        while True:
            with self.cv:
                if not self.pending:
                    self.cv.wait(timeout=IDLE_S)
                    if not self.pending:
                        self.thread = None
                        return
                batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            try:
                self._write(batch)
            except Exception as exc:  # a bug here must not leave requests waiting on a writer that is gone
                log.exception("group commit: a batch of %d failed outside its statement", len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)

    def _write(self, batch: list[tuple[dict[str, Any], Future[Row]]]) -> None:
        try:
            with self.engine.connect() as conn:
                rows = self.write(conn.execution_options(isolation_level="AUTOCOMMIT"), [i for i, _ in batch])
        except Exception as exc:
            if len(batch) == 1 or isinstance(exc, NOT_SENT_AGAIN):
                for _, future in batch:
                    future.set_exception(exc)
                return
            for one in batch:  # the database refused the statement: one bad row fails only its own request
                self._write([one])
            return
        for (_, future), row in zip(batch, rows, strict=True):
            future.set_result(row)


_writers: dict[int, _Writer] = {}
_lock = threading.Lock()


def submit(engine: Engine, item: dict[str, Any], write: WriteBatch) -> Row:
    """Write item with whatever else is waiting on this engine; its row once committed (None: refused)."""
    with _lock:
        writer = _writers.get(id(engine))
        if writer is None or writer.engine is not engine:  # a new engine (tests reset it) gets a new writer
            writer = _writers[id(engine)] = _Writer(engine, write)
    return writer.submit(item)
