"""Admission caps: 429 when the service, or one requester, has too many runs waiting; 422 for a cuda check
the executor has too few GPUs for (whichever route queues it: a run, a rerun, a suite, a sweep, a bisect).

Counted in the request's own transaction on every POST. The caps are soft (two racing requests may
both pass: nothing locks), which is what a cap on a CI burst needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from models import Run
from service.core.errors import TooManyRequests
from service.core.run_state import UNFINISHED, RunState
from service.core.settings import Settings
from service.executors.gpus import Budget

RETRY_AFTER_S = 30  # a 429's Retry-After: about the time a queued run needs to start


@dataclass(frozen=True)
class Caps:
    """Admission limits: unfinished runs in the whole service, queued runs per requester, and (`gpus`) the
    GPUs a cuda check's ranks need on the executor's nodes (service/executors/gpus.py)."""

    max_in_flight: int
    max_queued_per_requester: int
    gpus: Budget | None = None
    # False for the scheduler's own work (a track's suite): only the GPU budget applies, never a 429
    counted: bool = True

    @classmethod
    def gpus_only(cls, settings: Settings) -> Caps:
        """What the scheduler's own queueing is held to: a cuda check must fit the executor's GPUs."""
        return cls(max_in_flight=0, max_queued_per_requester=0, gpus=Budget(settings), counted=False)


def _upto(query: Select[tuple[int]], cap: int) -> Any:
    """A scalar subquery: how many rows query matches, counting no further than cap."""
    return select(func.count()).select_from(query.limit(cap).subquery()).scalar_subquery()


def current_counts(session: Session, caps: Caps, requester: str | None) -> tuple[int, int]:
    """(unfinished runs, this requester's queued runs), each counted no further than its cap."""
    # The states listed (not "NOT IN terminal"), so Postgres reads ix_runs_state_created rather than
    # every row; counting stops at the cap; both counts travel in one statement.
    unfinished = Run.state.in_([s.value for s in UNFINISHED])
    queued_by_me = (Run.state == RunState.QUEUED.value) & (Run.requester == requester)
    row = session.execute(select(
        _upto(select(Run.id).where(unfinished), caps.max_in_flight),
        _upto(select(Run.id).where(queued_by_me), caps.max_queued_per_requester),
    )).one()
    return int(row[0] or 0), int(row[1] or 0)


def check_caps(session: Session, caps: Caps, requester: str | None) -> None:
    """429 (with Retry-After) when the service or this requester has too many runs waiting."""
    total, mine = current_counts(session, caps, requester)
    if total >= caps.max_in_flight:
        raise TooManyRequests(
            f"runs: {total} runs are queued or in flight (PARITY_MAX_IN_FLIGHT={caps.max_in_flight}); "
            f"retry later", retry_after=RETRY_AFTER_S,
        )
    if mine >= caps.max_queued_per_requester:
        raise TooManyRequests(
            f"runs: {requester!r} already has {mine} queued runs "
            f"(PARITY_MAX_QUEUED_PER_REQUESTER={caps.max_queued_per_requester}); retry later",
            retry_after=RETRY_AFTER_S,
        )
