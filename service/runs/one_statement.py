"""POST /runs and GET /runs/{id} in one statement each, on a connection that commits per statement.

The ORM path (records.py) spends a POST on BEGIN, a token SELECT, an environment SELECT, the run
INSERT, the event INSERT and COMMIT, each a round trip, plus the unit of work's bookkeeping in
Python. Here the usual case is one statement: a CTE that inserts the run and its `queued` event
while re-checking, in the same snapshot, everything the skipped SELECTs would have checked:

- the token row is still unrevoked and unexpired (a revocation committed before the statement
  starts is seen: a revoked token stops working at once, however long this process remembered it);
- the environment exists and is usable (not failed, not pruned), its last-use stamp is fresh (the
  ORM path rewrites it once a minute), and the default environment needs no version fix-up;
- a repeated Idempotency-Key inserts nothing (ON CONFLICT DO NOTHING).

When any of these does not hold the statement inserts nothing and returns no row, and the caller
takes the ORM path, which raises the precise error or does the bookkeeping: behaviour is the ORM
path's, the usual case is just cheaper.

Durability: on an autocommit connection the statement is its own transaction; psycopg returns its
rows only after Postgres has committed it (synchronous_commit as configured), so a 202 built from
them still means committed. In tests the session is bound to a connection inside an outer
transaction, and the statement runs there instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from models import Phase, Run
from models.base import utcnow
from service.core import async_db
from service.core.checks import spec_identity, track_of
from service.core.db import autocommit
from service.core.driver_cursor import driver_cursor
from service.core.run_state import RunState
from service.environments.registry import DEFAULT_ENVIRONMENT, LAST_USED_RESOLUTION
from service.runs import group_commit

QUEUED_REASON = "queued by API"

_RUN_COLUMNS = [c.name for c in Run.__table__.c]
_PHASE_COLUMNS = [c.name for c in Phase.__table__.c]

# Rows in, rows out: a batch of requests (group_commit.py) is one statement and one commit.
# `ord` is the request's place in the batch; run ids are drawn here so each RETURNING row finds it.
INSERT_RUNS = f"""
WITH input AS MATERIALIZED (
    SELECT x.* FROM jsonb_to_recordset(%(batch)s::jsonb) AS x(
        ord int, environment text, used_after timestamptz, fixup boolean, token_id int, now timestamptz,
        config text, spec jsonb, labels jsonb, requester text, idempotency_key text, check_key text,
        check_name text, track text)
), ok AS MATERIALIZED (
    SELECT i.*, e.id AS environment_id, e.name AS environment_name, nextval('runs_id_seq') AS run_id
    FROM input i
    JOIN environments e ON e.name = i.environment AND e.state NOT IN ('failed', 'pruned')
                       AND e.last_used_at > i.used_after
                       AND NOT (i.fixup AND e.python = %(own_python)s AND e.megatron_core IS NULL)
    JOIN api_tokens t ON t.id = i.token_id AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > i.now)
), run AS (
    INSERT INTO runs (id, config, spec, environment_id, labels, requester, token_id, idempotency_key, rerun_of_id,
                      check_key, check_name, track, state, state_version, updated_at, cancel_requested,
                      scheduler_failures, signatures, summary, regression, created_at)
    SELECT run_id, config, spec, environment_id, labels, requester, token_id, idempotency_key, NULL,
           check_key, check_name, track, %(state)s, 0, now, false, 0, '[]'::jsonb, '{{}}'::jsonb, false, now
    FROM ok ORDER BY ord
    ON CONFLICT ON CONSTRAINT uq_runs_token_id_idempotency_key DO NOTHING
    RETURNING {", ".join(_RUN_COLUMNS)}
), event AS (
    INSERT INTO run_events (run_id, from_state, to_state, reason, at)
    SELECT id, NULL, state, %(reason)s, created_at FROM run
)
SELECT run.*, ok.environment_name, ok.ord FROM run JOIN ok ON ok.run_id = run.id
"""

# the run, its environment's name and its phases (one row per phase, or one with NULLs when none)
READ_RUN = f"""
SELECT {", ".join("r." + c for c in _RUN_COLUMNS)}, e.name, {", ".join("p." + c for c in _PHASE_COLUMNS)}
FROM runs r JOIN environments e ON e.id = r.environment_id LEFT JOIN phases p ON p.run_id = r.id
WHERE r.id = %(id)s ORDER BY p.id
"""
_N_RUN = len(_RUN_COLUMNS)
_PHASE_ID = _N_RUN + 1 + _PHASE_COLUMNS.index("id")


class Stored:
    """A row read like a Run for run_out(): columns as attributes, the environment's name, phases."""

    def __init__(self, columns: dict[str, Any], environment: str, phases: list[dict[str, Any]] | None = None):
        self.__dict__.update(columns)
        self.environment = _Named(environment)
        self.phases = phases or []

    def __getattr__(self, name: str) -> Any:  # only reached for a name that is not a column: typing's view
        raise AttributeError(name)


class _Named:
    def __init__(self, name: str):
        self.name = name


def insert_run(session: Session, *, spec: RunSpec, environment: str, labels: dict[str, str], requester: str,
               token_id: int, idempotency_key: str | None, job_python: str | None) -> Stored | None:
    """Queue the run and its event (committed, with other requests' runs); None when a check failed."""
    spec_dict = spec.to_dict()
    key, name = spec_identity(spec)  # the request parsed the spec once: no second parse for its identity
    now = utcnow()
    item = {
        "environment": environment, "used_after": (now - LAST_USED_RESOLUTION).isoformat(),
        "fixup": environment == DEFAULT_ENVIRONMENT and not job_python, "token_id": token_id,
        "now": now.isoformat(), "config": spec.config, "spec": spec_dict, "labels": labels, "requester": requester,
        "idempotency_key": idempotency_key, "check_key": key, "check_name": name[:500],
        "track": track_of(labels, environment)[:200],
    }
    bind = session.get_bind()
    if isinstance(bind, Connection):  # tests: inside the session's outer transaction, alone
        found = write_batch(session.connection(), [item])[0]
    else:
        found = group_commit.submit(bind.engine, item, write_batch)
    if found is None:
        return None
    return Stored(dict(zip(_RUN_COLUMNS, found, strict=False)), found[_N_RUN])


def write_batch(conn: Connection, items: list[dict[str, Any]]) -> list[tuple[Any, ...] | None]:
    """Insert the runs of items in one statement on conn; each item's row, or None where it was refused."""
    batch = json.dumps([{**item, "ord": i} for i, item in enumerate(items)])
    params = {"batch": batch, "own_python": sys.executable, "state": RunState.QUEUED.value, "reason": QUEUED_REASON}
    with driver_cursor(conn) as cursor:
        cursor.execute(INSERT_RUNS, params)
        rows = cursor.fetchall()
    found: list[tuple[Any, ...] | None] = [None] * len(items)
    for row in rows:
        found[row[-1]] = row
    return found


def _fetch(session: Session, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    # psycopg's cursor directly: SQLAlchemy's statement cache keys and result wrapping were a third
    # of a GET's CPU, for a statement that is a fixed string with the same column order every time
    with autocommit(session) as conn, driver_cursor(conn) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def read_run(session: Session, run_id: int) -> Stored | None:
    """The run, its environment's name and its phases (ordered by id) in one round trip; None if absent."""
    return _stored_run(_fetch(session, READ_RUN, {"id": run_id}))


async def read_run_async(run_id: int) -> Stored | None:
    """read_run on the event loop, through async_db's pool (no thread, no session)."""
    return _stored_run(await async_db.fetch(READ_RUN, {"id": run_id}))


def _stored_run(rows: Sequence[tuple[Any, ...]]) -> Stored | None:
    if not rows:
        return None
    first = rows[0]
    phases = [_phase(r[_N_RUN + 1:]) for r in rows if r[_PHASE_ID] is not None]
    return Stored(dict(zip(_RUN_COLUMNS, first, strict=False)), first[_N_RUN], phases)


def _phase(values: tuple[Any, ...]) -> dict[str, Any]:
    phase = dict(zip(_PHASE_COLUMNS, values, strict=True))
    nodes = (phase.get("info") or {}).get("rank_nodes")  # as Phase.rank_nodes reads it
    phase["rank_nodes"] = list(nodes) if isinstance(nodes, list) else []
    return phase
