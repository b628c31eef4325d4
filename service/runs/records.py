"""Runs, written and read: the one module through which the API (and every other writer) queues,
reads, lists, cancels and reruns a run. Never commits.

Two ways queue a run, both here and both on SQLAlchemy: `create_run` (the ORM: a replayed
Idempotency-Key, an environment to touch or fix up, a rerun, the service's own runs) and
`queue_run`, POST /runs' usual case, one statement for a whole batch of concurrent requests
(`group_commit.py` says why a batch). Either way callers get the `Run` model: from the session
(`get_run`, `find_run`) where a transaction works on it, or built from the hot paths' one read shape
(`queue_run`'s RETURNING, `read_run` on the event loop), detached, for answering.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg_pool import PoolTimeout
from sqlalchemy import Connection, Integer, Select, bindparam, literal_column, select, text
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, joinedload, selectinload

from jobs.spec import RunSpec
from models import Environment, Phase, Run, RunEvent
from models.base import utcnow
from service.core.check_spec import run_spec_of
from service.core.checks import SELFTEST_LABEL, identify, spec_identity, track_of
from service.core.db import read_pool
from service.core.errors import Conflict, Forbidden, NotFound
from service.core.run_state import TERMINAL, RunState, transition
from service.core.tracks import Grant, authorize_track
from service.environments.registry import DEFAULT_ENVIRONMENT, LAST_USED_RESOLUTION
from service.runs import group_commit
from service.runs.admission import Caps, admitted, check_caps

QUEUED_REASON = "queued by API"
_Model = TypeVar("_Model", Run, Phase, Environment)


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
        if caps is not None:
            admitted(session, requester)
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
    if caps is not None:
        admitted(session, requester)
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


# The hot paths' read shape (POST /runs' RETURNING, GET /runs/{id} on the event loop): the run's
# columns, its environment's name, then one row per phase (ordered by id; NULLs when it has none).
# The rows become the models themselves (detached, for reading: run_out reads nothing else); the
# ORM's session and loading machinery cost more than the statement, on the async driver twice as much.
_RUN_KEYS = [a.key for a in Run.__mapper__.column_attrs]
_PHASE_KEYS = [a.key for a in Phase.__mapper__.column_attrs]
_READ = (select(*(getattr(Run, k) for k in _RUN_KEYS), Environment.name,
                *(getattr(Phase, k).label(f"phase_{k}") for k in _PHASE_KEYS))
         .join(Environment, Environment.id == Run.environment_id).outerjoin(Phase, Phase.run_id == Run.id)
         .where(Run.id == bindparam("run_id")).order_by(Phase.id))
_READ_SQL = str(_READ.compile(dialect=psycopg_dialect()))
_N_RUN = len(_RUN_KEYS)
_PHASE_ID = _N_RUN + 1 + _PHASE_KEYS.index("id")


def _loaded(model: type[_Model], values: dict[str, Any]) -> _Model:
    """An instance of model holding values as loaded state, as the ORM's own loader fills one: into
    the instance's dict, past the attribute events that a constructor fires for each of a run's ~40
    columns (that was most of building a Run: 0.2 ms a GET). Detached, never flushed."""
    obj = model.__mapper__.class_manager.new_instance()
    obj.__dict__.update(values)
    return obj


def _run_of(rows: Sequence[Sequence[Any]]) -> Run:
    """The Run (environment name, phases) of one read shape's rows."""
    first = rows[0]
    run = _loaded(Run, dict(zip(_RUN_KEYS, first[:_N_RUN], strict=True)))
    phases = [_loaded(Phase, dict(zip(_PHASE_KEYS, row[_N_RUN + 1:], strict=True))) for row in rows
              if len(row) > _PHASE_ID and row[_PHASE_ID] is not None]
    environment = _loaded(Environment, {"id": run.environment_id, "name": first[_N_RUN]})
    run.__dict__.update(environment=environment, phases=phases)
    return run


# Rows in, runs out: a batch of requests is one statement and one commit. Besides inserting the run
# and its `queued` event it re-checks, in the statement's own snapshot, what create_run's SELECTs
# would: the token is still unrevoked and unexpired (a revocation committed before the statement is
# seen, however long the process remembered the token), the environment is usable (not failed or
# pruned), its last-use stamp is fresh (create_run rewrites it once a minute) and the default one
# needs no version fix-up; a repeated Idempotency-Key inserts nothing. A request whose check fails
# gets no row, and queue_run answers None: the caller takes create_run, which raises the precise
# error or does the bookkeeping.
QUEUE_RUNS = text(f"""
WITH input AS MATERIALIZED (
    SELECT x.* FROM jsonb_to_recordset(CAST(:batch AS jsonb)) AS x(
        ord int, environment text, used_after timestamptz, fixup boolean, token_id int, now timestamptz,
        config text, spec jsonb, labels jsonb, requester text, idempotency_key text, check_key text,
        check_name text, track text)
), ok AS MATERIALIZED (
    SELECT i.*, e.id AS environment_id, e.name AS environment_name, nextval('runs_id_seq') AS run_id
    FROM input i
    JOIN environments e ON e.name = i.environment AND e.state NOT IN ('failed', 'pruned')
                       AND e.last_used_at > i.used_after
                       AND NOT (i.fixup AND e.python = :own_python AND e.megatron_core IS NULL)
    JOIN api_tokens t ON t.id = i.token_id AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > i.now)
), run AS (
    INSERT INTO runs (id, config, spec, environment_id, labels, requester, token_id, idempotency_key, rerun_of_id,
                      check_key, check_name, track, state, state_version, updated_at, cancel_requested,
                      scheduler_failures, signatures, summary, regression, created_at)
    SELECT run_id, config, spec, environment_id, labels, requester, token_id, idempotency_key, NULL,
           check_key, check_name, track, :state, 0, now, false, 0, '[]'::jsonb, '{{}}'::jsonb, false, now
    FROM ok ORDER BY ord
    ON CONFLICT ON CONSTRAINT uq_runs_token_id_idempotency_key DO NOTHING
    RETURNING {", ".join(_RUN_KEYS)}
), event AS (
    INSERT INTO run_events (run_id, from_state, to_state, reason, at)
    SELECT id, NULL, state, :reason, created_at FROM run
)
SELECT run.*, ok.environment_name, ok.ord FROM run JOIN ok ON ok.run_id = run.id
""").columns(*(getattr(Run, k) for k in _RUN_KEYS), Environment.name, literal_column("ord", Integer))


def queue_run(session: Session, *, spec: RunSpec, environment: str, labels: dict[str, str], requester: str,
              token_id: int, idempotency_key: str | None, job_python: str | None) -> Run | None:
    """Queue the run and its event in one statement (committed, with other requests' runs); None when a check failed."""
    key, name = spec_identity(spec)  # the request parsed the spec once: no second parse for its identity
    now = utcnow()
    item = {
        "environment": environment, "used_after": (now - LAST_USED_RESOLUTION).isoformat(),
        "fixup": environment == DEFAULT_ENVIRONMENT and not job_python, "token_id": token_id,
        "now": now.isoformat(), "config": spec.config, "spec": spec.to_dict(), "labels": labels,
        "requester": requester, "idempotency_key": idempotency_key, "check_key": key, "check_name": name[:500],
        "track": track_of(labels, environment)[:200],
    }
    bind = session.get_bind()
    if isinstance(bind, Connection):  # tests: inside the session's outer transaction, alone
        return insert_batch(session.connection(), [item])[0]
    # committed by the batch's own autocommit connection before it answers
    return group_commit.submit(bind, item, insert_batch)


def insert_batch(conn: Connection, items: list[dict[str, Any]]) -> list[Run | None]:
    """Insert the runs of items in one statement on conn; each item's run, or None where it was refused."""
    batch = json.dumps([{**item, "ord": i} for i, item in enumerate(items)])
    rows = conn.execute(QUEUE_RUNS, {"batch": batch, "own_python": sys.executable, "state": RunState.QUEUED.value,
                                     "reason": QUEUED_REASON})
    found: list[Run | None] = [None] * len(items)
    for row in rows:
        found[row[-1]] = _run_of([row[:-1]])
    return found


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


async def read_run(run_id: int) -> Run | None:
    """The run with its environment's name and its phases, read on the event loop (no thread, no
    transaction: autocommit); detached, for reading. None if absent.

    The statement is `_READ`, compiled once; it runs on a connection of psycopg's own pool
    (db.read_pool). SQLAlchemy's execute and result wrapping cost 2.3-3.1 ms of CPU a read against
    1.3-1.7 ms this way (the same 3000 reads of a 1M-run database, 2026-12-03, load 10), and GET
    /runs/{id} is the request a polling CI sends most. psycopg already hands back what the models hold
    (JSONB decoded, timestamps aware), so the rows build the same Run.

    A pooled connection that a database restart broke fails its first statement: the pool drops it (and
    `check` every idle one that broke with it), and the read is tried once more on a fresh one (a read
    can be repeated: nothing was written). A database that stays away (no connection within
    db.CONNECT_TIMEOUT_S) raises OperationalError, which the app answers 503.
    """
    for attempt in (1, 2):
        pool = await read_pool()
        try:
            async with pool.connection() as conn, conn.cursor() as cursor:
                await cursor.execute(_READ_SQL, {"run_id": run_id})
                rows = await cursor.fetchall()
            break
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            if attempt == 2 or isinstance(exc, PoolTimeout):
                raise OperationalError(_READ_SQL, {"run_id": run_id}, exc) from exc
            await pool.check()
    return _run_of(rows) if rows else None


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
