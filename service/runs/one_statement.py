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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from models import Environment, Phase, Run
from models.base import utcnow
from service.core.checks import check_key, check_name, track_of
from service.core.run_state import RunState
from service.environments.registry import DEFAULT_ENVIRONMENT, LAST_USED_RESOLUTION

QUEUED_REASON = "queued by API"

INSERT_RUN = """
WITH env AS (
    SELECT id, name FROM environments
    WHERE name = %(environment)s AND state NOT IN ('failed', 'pruned') AND last_used_at > %(used_after)s
      AND NOT (%(fixup)s AND python = %(own_python)s AND megatron_core IS NULL)
), tok AS (
    SELECT id FROM api_tokens
    WHERE id = %(token_id)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > %(now)s)
), run AS (
    INSERT INTO runs (config, spec, environment_id, labels, requester, token_id, idempotency_key, rerun_of_id,
                      check_key, check_name, track, state, state_version, updated_at, cancel_requested,
                      scheduler_failures, signatures, summary, regression, created_at)
    SELECT %(config)s, %(spec)s::jsonb, env.id, %(labels)s::jsonb, %(requester)s, tok.id, %(idempotency_key)s,
           NULL, %(check_key)s, %(check_name)s, %(track)s, %(state)s, 0, %(now)s, false, 0, '[]'::jsonb,
           '{}'::jsonb, false, %(now)s
    FROM env, tok
    ON CONFLICT ON CONSTRAINT uq_runs_token_id_idempotency_key DO NOTHING
    RETURNING *
), event AS (
    INSERT INTO run_events (run_id, from_state, to_state, reason, at)
    SELECT id, NULL, state, %(reason)s, %(now)s FROM run
)
SELECT run.*, env.name AS environment_name FROM run, env
"""


@contextmanager
def autocommit(session: Session) -> Iterator[Connection]:
    """A connection on which each statement is its own transaction (no BEGIN/COMMIT round trips).

    The session's own connection when it is bound to one (tests: an outer transaction rolled back
    afterwards), so the statement sees and joins what the test wrote.
    """
    bind = session.get_bind()
    if isinstance(bind, Connection):
        yield session.connection()
        return
    with bind.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


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
    """Queue the run and its event in one statement; None when a check failed (take the ORM path)."""
    spec_dict = spec.to_dict()
    now = utcnow()
    params = {
        "environment": environment, "used_after": now - LAST_USED_RESOLUTION,
        "fixup": environment == DEFAULT_ENVIRONMENT and not job_python, "own_python": sys.executable,
        "token_id": token_id, "now": now, "config": spec.config, "spec": json.dumps(spec_dict),
        "labels": json.dumps(labels), "requester": requester, "idempotency_key": idempotency_key,
        "check_key": check_key(spec_dict), "check_name": check_name(spec_dict)[:500],
        "track": track_of(labels, environment)[:200], "state": RunState.QUEUED.value, "reason": QUEUED_REASON,
    }
    with autocommit(session) as conn:
        row = conn.exec_driver_sql(INSERT_RUN, params).mappings().first()
    if row is None:
        return None
    columns = dict(row)
    return Stored(columns, columns.pop("environment_name"))


_RUN = Run.__table__
_PHASE_COLUMNS = [c.label(f"phase_{c.name}") for c in Phase.__table__.c]
READ_RUN = (
    select(_RUN, Environment.name.label("environment_name"), *_PHASE_COLUMNS)
    .join(Environment, Environment.id == _RUN.c.environment_id)
    .outerjoin(Phase, Phase.run_id == _RUN.c.id)
    .order_by(Phase.id)
)


def read_run(session: Session, run_id: int) -> Stored | None:
    """The run, its environment's name and its phases (ordered by id) in one round trip; None if absent."""
    with autocommit(session) as conn:
        rows = conn.execute(READ_RUN.where(_RUN.c.id == run_id)).mappings().all()
    if not rows:
        return None
    first = rows[0]
    columns = {c.name: first[c.name] for c in _RUN.c}
    phases = [_phase(r) for r in rows if r["phase_id"] is not None]
    return Stored(columns, first["environment_name"], phases)


def _phase(row: Any) -> dict[str, Any]:
    phase = {c.name: row[f"phase_{c.name}"] for c in Phase.__table__.c}
    nodes = (phase.get("info") or {}).get("rank_nodes")  # as Phase.rank_nodes reads it
    phase["rank_nodes"] = list(nodes) if isinstance(nodes, list) else []
    return phase
