"""Runs, written and read: the one module through which the API (and every other writer) queues,
reads, lists, cancels and reruns a run, on the ORM and the caller's session. Never commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, bindparam, literal_column, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload, selectinload

from jobs.spec import RunSpec
from models import Environment, Run, RunEvent
from service.core.check_spec import run_spec_of
from service.core.checks import SELFTEST_LABEL, identify
from service.core.errors import Conflict, Forbidden, NotFound
from service.core.run_state import TERMINAL, RunState
from service.core.tracks import Grant, authorize_track
from service.runs.admission import Caps, check_caps
from service.runs.lifecycle import transition

QUEUED_REASON = "queued by API"


def create_run(
    session: Session,
    *,
    spec: RunSpec,
    environment: Environment,
    labels: dict[str, str],
    requester: str | None,
    token_id: int | None = None,
    idempotency_key: str | None = None,
    rerun_of_id: int | None = None,
    caps: Caps | None = None,
) -> tuple[Run, bool]:
    """Queue a run; with this token's idempotency key seen before, return that run instead. -> (run, created)."""
    spec_dict = spec.to_dict()
    same_key = select(Run).where(Run.token_id == token_id, Run.idempotency_key == idempotency_key)
    if idempotency_key is not None:
        existing = session.scalar(same_key)
        if existing is not None:
            return _same_request(existing, spec_dict, environment, labels), False
    if caps is not None:
        if caps.gpus is not None:
            caps.gpus.check(spec)  # a permanent refusal (422) before a transient one (429)
        if caps.counted:
            check_caps(session, caps, requester)
    run = Run(
        config=spec.config,
        spec=spec_dict,
        environment=environment,
        labels=labels,
        requester=requester,
        token_id=token_id,
        idempotency_key=idempotency_key,
        rerun_of_id=rerun_of_id,
        state=RunState.QUEUED.value,
        signatures=[],
        summary={},
    )
    identify(run, environment.name, spec)
    if idempotency_key is None:
        session.add(run)
        session.flush()
        session.add(RunEvent(run_id=run.id, from_state=None, to_state=run.state, reason=QUEUED_REASON))
        return run, True
    try:
        # a concurrent request with the same key loses the unique race here, not with a 500
        with session.begin_nested():
            session.add(run)
            session.flush()
    except IntegrityError:
        existing = session.scalar(same_key)
        if existing is None:
            raise
        return _same_request(existing, spec_dict, environment, labels), False
    session.add(RunEvent(run_id=run.id, from_state=None, to_state=run.state, reason=QUEUED_REASON))
    return run, True


def _same_request(existing: Run, spec: dict[str, Any], environment: Environment, labels: dict[str, str]) -> Run:
    # the whole body is compared: a replay that changes only a label is a different request
    differs = [name for name, same in (("spec", existing.spec == spec),
                                       ("environment", existing.environment_id == environment.id),
                                       ("labels", existing.labels == labels)) if not same]
    if differs:
        raise Conflict(
            f"Idempotency-Key: already used by this token for a request with a different {', '.join(differs)} "
            f"(run {existing.id})",
            field="Idempotency-Key",
        )
    return existing


# a run with its environment (and its phases, ordered by id) joined: one round trip, compiled once
# (SQLAlchemy caches the statement's compiled form by its shape). Of the environment only its name:
# its package lists (a pip freeze, twice) would be parsed on every read of every run.
_ONE_RUN = (select(Run).where(Run.id == bindparam("run_id"))
            .options(joinedload(Run.environment).load_only(Environment.id, Environment.name)))
_ONE_RUN_WITH_PHASES = _ONE_RUN.options(joinedload(Run.phases))


def find_run(session: Session, run_id: int, *, with_phases: bool = False) -> Run | None:
    """One run with its environment (and phases if asked), or None."""
    query = _ONE_RUN_WITH_PHASES if with_phases else _ONE_RUN
    return session.scalars(query, {"run_id": run_id}).unique().first()


def get_run(session: Session, *, run_id: int, with_phases: bool = False) -> Run:
    """One run (with its environment, and phases if asked), or 404."""
    run = find_run(session, run_id, with_phases=with_phases)
    if run is None:
        raise NotFound(f"run {run_id} does not exist", field="run_id")
    return run


@dataclass(frozen=True)
class RunFilter:
    """What GET /runs and the dashboard list can filter on."""

    config: str | None = None
    check: str | None = None
    track: str | None = None
    environment: str | None = None
    state: str | None = None
    verdict: str | None = None
    regression: bool | None = None
    labels: dict[str, str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    # detector self-test runs: None both, False none (the dashboard's default views), True only them
    selftest: bool | None = None


def filtered_runs(filters: RunFilter) -> Select[tuple[Run]]:
    """A SELECT of runs matching filters (no ordering or paging)."""
    query = select(Run)
    if filters.config:
        query = query.where(Run.config == filters.config)
    if filters.check:
        query = query.where(Run.check_key == filters.check)
    if filters.track:
        query = query.where(Run.track == filters.track)
    if filters.environment:
        query = query.join(Environment).where(Environment.name == filters.environment)
    if filters.state:
        query = query.where(Run.state == filters.state)
    if filters.verdict:
        query = query.where(Run.verdict == filters.verdict)
    if filters.regression is not None:
        query = query.where(Run.regression.is_(filters.regression))
    if filters.labels:
        query = query.where(Run.labels.contains(filters.labels))
    if filters.since:
        query = query.where(Run.created_at >= filters.since)
    if filters.until:
        query = query.where(Run.created_at < filters.until)
    if filters.selftest is not None:
        # the key as a literal, not a parameter: a prepared statement's generic plan could not prove
        # the partial index ix_runs_selftest (labels ? 'selftest') applies
        marked = Run.labels.has_key(literal_column(f"'{SELFTEST_LABEL}'"))
        query = query.where(marked if filters.selftest else ~marked)
    return query


def list_runs(session: Session, *, filters: RunFilter, limit: int, offset: int) -> tuple[list[Run], bool]:
    """A page of runs, newest first. -> (runs, has_more)."""
    query = (
        filtered_runs(filters)
        .options(selectinload(Run.environment))
        .order_by(Run.id.desc())
        .limit(limit + 1)
        .offset(offset)
    )
    rows = list(session.scalars(query))
    return rows[:limit], len(rows) > limit


def may_act_on(run: Run, *, token_id: int | None, scopes: list[str]) -> None:
    """403 unless the caller's token queued the run (same token id) or holds the admin scope.

    By id, not name: names are not unique, so any token called "ci" could cancel every run "ci" queued.
    Runs the service queues itself (bisect steps, self-tests) have no token: only an admin acts on them.
    """
    if "admin" in scopes:
        return
    if run.token_id is None or run.token_id != token_id:
        raise Forbidden(
            f"run {run.id} was queued by another token ({run.requester!r}); only that token or an admin may do this",
            field="run_id",
        )


def cancel_run(session: Session, *, run_id: int, token_id: int | None = None, scopes: list[str] | None = None) -> Run:
    """Cancel a queued run now; ask the scheduler to cancel an in-flight one; 409 if finished."""
    run = session.scalar(select(Run).where(Run.id == run_id).with_for_update())
    if run is None:
        raise NotFound(f"run {run_id} does not exist", field="run_id")
    may_act_on(run, token_id=token_id, scopes=scopes if scopes is not None else ["admin"])
    if RunState(run.state) in TERMINAL or run.state == RunState.EVALUATING:
        raise Conflict(f"run {run_id} is {run.state}; only queued or running runs can be cancelled", field="state")
    if run.state == RunState.QUEUED:
        transition(session, run, RunState.CANCELLED, "cancelled by API before submission")
    else:
        run.cancel_requested = True
    return get_run(session, run_id=run_id)


def rerun(
    session: Session, *, run_id: int, requester: str | None, scopes: list[str] | None = None,
    token_id: int | None = None, caps: Caps | None = None, writer: Grant | None = None,
) -> Run:
    """Queue a new run with the same spec, environment and labels as run_id (on a track `writer` may write)."""
    original = get_run(session, run_id=run_id)
    may_act_on(original, token_id=token_id, scopes=scopes if scopes is not None else ["admin"])
    if writer is not None:
        authorize_track(writer, labels=original.labels, environment=original.environment.name)
    spec = run_spec_of(original.spec)
    run, _ = create_run(
        session,
        spec=spec,
        environment=original.environment,
        labels=dict(original.labels),
        requester=requester,
        token_id=token_id,
        rerun_of_id=original.id,
        caps=caps,
    )
    return get_run(session, run_id=run.id)
