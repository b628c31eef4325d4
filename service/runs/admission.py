"""Admission caps: 429 when the service, or one requester, has too many runs waiting.

Counting unfinished runs exactly on every POST costs Postgres a scan of up to `max_in_flight` index
entries (and their heap rows: new rows are not yet all-visible), the largest part of a POST's
database time under a CI burst. The caps are soft anyway (two racing requests may both pass), so
each API process reuses its counts for COUNT_TTL_S and adds the runs it admits itself meanwhile.
Another process's admissions are seen at the next refresh: the overshoot is bounded by what the
other processes admit in COUNT_TTL_S.

One refresh at a time per process: while one request counts, the others use the counts it is
replacing (plus their own admissions) instead of all counting at once when the counts expire, which
under a burst had every request hold a connection for the same query. The count runs on its own
autocommit connection, so the request's session opens no transaction for it.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Select, func, select
from sqlalchemy.orm import Session

from models import Run
from service.core.db import autocommit
from service.core.errors import TooManyRequests
from service.core.run_state import TERMINAL, RunState

COUNT_TTL_S = 0.5


@dataclass(frozen=True)
class Caps:
    """Admission limits: unfinished runs in the whole service, and queued runs per requester."""

    max_in_flight: int
    max_queued_per_requester: int
    retry_after_s: int = 30


@dataclass
class _Counts:
    at: float
    total: int
    mine: dict[str | None, int] = field(default_factory=dict)
    refreshing: bool = False


_lock = threading.Lock()
# Per engine (tests switch databases within one process): a new engine after reset_engine() starts
# with no counts, and a disposed one's counts go with it.
_counts: weakref.WeakKeyDictionary[Engine, _Counts] = weakref.WeakKeyDictionary()


def _database(session: Session) -> Engine:
    bind = session.get_bind()
    return bind.engine if isinstance(bind, Connection) else bind  # a Connection in tests


def _upto(query: Select[tuple[int]], cap: int) -> Any:
    """A scalar subquery: how many rows query matches, counting no further than cap."""
    return select(func.count()).select_from(query.limit(cap).subquery()).scalar_subquery()


def _query(session: Session, caps: Caps, requester: str | None) -> tuple[int, int]:
    # The states listed (not "NOT IN terminal"), so Postgres reads ix_runs_state_created rather than
    # every row; counting stops at the cap; both counts travel in one statement.
    unfinished = Run.state.in_([s.value for s in RunState if s not in TERMINAL])
    queued_by_me = (Run.state == RunState.QUEUED.value) & (Run.requester == requester)
    with autocommit(session) as conn:
        row = conn.execute(select(
            _upto(select(Run.id).where(unfinished), caps.max_in_flight),
            _upto(select(Run.id).where(queued_by_me), caps.max_queued_per_requester),
        )).one()
    return int(row[0] or 0), int(row[1] or 0)


def current_counts(session: Session, caps: Caps, requester: str | None) -> tuple[int, int]:
    """(unfinished runs, this requester's queued runs), at most COUNT_TTL_S old plus own admissions."""
    key, now = _database(session), time.monotonic()
    with _lock:
        known = _counts.get(key)
        if known is not None and requester in known.mine:
            if now - known.at < COUNT_TTL_S or known.refreshing:
                return known.total, known.mine[requester]
        if known is not None:
            known.refreshing = True
    try:
        total, mine = _query(session, caps, requester)
    finally:
        if known is not None:
            with _lock:
                known.refreshing = False
    with _lock:
        known = _counts.get(key)
        if known is None or now - known.at >= COUNT_TTL_S:
            known = _counts[key] = _Counts(at=now, total=total)
        known.total = max(known.total, total)
        known.mine[requester] = mine
    return total, mine


def admitted(session: Session, requester: str | None) -> None:
    """Count a run this process just queued into its cached counts."""
    with _lock:
        known = _counts.get(_database(session))
        if known is not None:
            known.total += 1
            if requester in known.mine:
                known.mine[requester] += 1


def check_caps(session: Session, caps: Caps, requester: str | None) -> None:
    """429 (with Retry-After) when the service or this requester has too many runs waiting."""
    total, mine = current_counts(session, caps, requester)
    if total >= caps.max_in_flight:
        raise TooManyRequests(
            f"runs: {total} runs are queued or in flight (PARITY_MAX_IN_FLIGHT={caps.max_in_flight}); "
            f"retry later", retry_after=caps.retry_after_s,
        )
    if mine >= caps.max_queued_per_requester:
        raise TooManyRequests(
            f"runs: {requester!r} already has {mine} queued runs "
            f"(PARITY_MAX_QUEUED_PER_REQUESTER={caps.max_queued_per_requester}); retry later",
            retry_after=caps.retry_after_s,
        )
