"""psycopg's own cursor on a pooled connection, with the disconnect handling SQLAlchemy's would give.

The hot statements (POST /runs' insert, GET /runs/{id}'s read) run on psycopg's cursor directly, past
SQLAlchemy's statement layer, whose caching and result wrapping were a third of their CPU. That layer
also owned what happens when the database drops a connection (a restart, a failover, a backend
terminated): it invalidates the pool and raises its OperationalError, which the app answers 503.
Past it, a dropped connection raised psycopg's own error (a 500) and went back to the pool, where each
dead neighbour failed one more request. Here a lost connection invalidates the whole pool, as
SQLAlchemy does, and is raised as ConnectionLost (a 503 with Retry-After).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection


class DatabaseDown(psycopg.OperationalError):
    """The database could not be reached, or dropped the connection (answered 503)."""


class ConnectionLost(DatabaseDown):
    """The connection broke under a statement: nothing is retried here.

    Whether an autocommit statement committed before its connection broke is not always knowable (a
    socket that just ends says nothing; even a terminated backend's error can follow a local commit
    under synchronous replication), and sending it again could queue a run twice. The client decides:
    a POST sent again with the same Idempotency-Key returns the run if it was queued.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an error's text, or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def driver_cursor(conn: Connection) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor of conn's psycopg connection; a broken connection invalidates the pool and raises ConnectionLost."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    try:
        with driver.cursor() as cursor:
            yield cursor
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        if not (driver.broken or driver.closed):
            raise  # the statement's own failure (a timeout, a full disk): the connection is fine
        conn.invalidate(exc)  # not back into the pool
        # its neighbours were opened against the same server: after a restart they are all dead, and a
        # pool that keeps them fails one request per connection (close=False: others may hold some)
        conn.engine.dispose(close=False)
        raise ConnectionLost(f"connection lost: {first_line(exc)[:300]}") from exc
