"""Waiting for runs to change without a thread or a database connection per waiter (the long poll
behind `parity submit --wait` and the suite wait).

A change of a run's state notifies CHANNEL with its id when its transaction commits (a trigger on
runs, migration 0019). Each API process keeps one LISTEN connection per database, on one thread, and
wakes the requests waiting on that run on their own event loop. A waiter registers before it reads
the run, so a change between the read and the wait is not missed; a notification that never comes
(the listener reconnecting) only makes the request answer at its timeout, with the run as it is.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import make_url

log = logging.getLogger(__name__)
# keep in step with alembic/versions/15_rev0019_notify_run_changes.py
CHANNEL = "parity_run_changed"
CONNECT_TIMEOUT_S = 5
READY_WAIT_S = 2.0  # how long a first waiter waits for the listener before reading anyway


class Waiter:
    """One request's wait: set when any of its runs changed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    async def wait(self, timeout_s: float) -> bool:
        """Whether a change came within timeout_s."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class Listener:
    """The LISTEN connection to one database and the waiters it wakes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ready = threading.Event()
        self.dead = False
        self._waiters: dict[int, set[Waiter]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._listen, daemon=True, name="run-changes").start()

    def _listen(self) -> None:
        plain = make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            with psycopg.connect(plain, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                self.ready.set()
                for note in conn.notifies():
                    self._wake(int(note.payload))
        except (psycopg.Error, ValueError) as exc:
            log.warning("LISTEN %s ended (%s): waits answer at their timeout until a new listener starts",
                        CHANNEL, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        finally:
            self.dead = True
            self.ready.set()
            with self._lock:
                waiters = [w for ws in self._waiters.values() for w in ws]
            for waiter in waiters:  # answer now with the run as it is, rather than at the timeout
                waiter.loop.call_soon_threadsafe(waiter.event.set)

    def _wake(self, run_id: int) -> None:
        with self._lock:
            waiters = list(self._waiters.get(run_id, ()))
        for waiter in waiters:
            waiter.loop.call_soon_threadsafe(waiter.event.set)

    @contextmanager
    def watch(self, run_ids: list[int]) -> Iterator[Waiter]:
        """A waiter woken by a change of any of run_ids, registered for the block."""
        waiter = Waiter(asyncio.get_running_loop())
        with self._lock:
            for run_id in run_ids:
                self._waiters.setdefault(run_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                for run_id in run_ids:
                    self._waiters.get(run_id, set()).discard(waiter)
                    if not self._waiters.get(run_id):
                        self._waiters.pop(run_id, None)


_listeners: dict[str, Listener] = {}
_listeners_lock = threading.Lock()


async def listener(url: str) -> Listener:
    """This process's listener on the database at url (started, or started again after it ended)."""
    with _listeners_lock:
        found = _listeners.get(url)
        if found is None or found.dead:
            found = _listeners[url] = Listener(url)
    if not found.ready.is_set():
        await asyncio.to_thread(found.ready.wait, READY_WAIT_S)
    return found
