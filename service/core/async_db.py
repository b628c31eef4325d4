"""Reads on the event loop: a psycopg async connection pool for the hot read routes CI polls.

A sync route costs a trip through the threadpool for the route and another for the session's end,
and under load every trip queues for the GIL behind the other request threads: the tail of GET
/runs/{id} was that queue, not Postgres. A read that needs one statement and no ORM objects runs
here instead, on the loop, with no thread at all.

Only reads: every write keeps its one owner, the request's Session (service/core/deps.py). The
pool's connections are autocommit, so a read is one round trip with no BEGIN/COMMIT.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from fastapi.concurrency import run_in_threadpool
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import make_url

from service.core.db import get_engine
from service.core.driver_cursor import DatabaseDown, first_line

log = logging.getLogger(__name__)

POOL_MAX = 10  # per API process, beside the sync engine's 10 + 20: well inside Postgres's 100
CONNECT_TIMEOUT_S = 5.0  # a database that is away answers 503 after this, not a hung request


_pools: dict[tuple[int, int], AsyncConnectionPool] = {}


async def _pool() -> AsyncConnectionPool:
    """This event loop's pool for the engine's database (opened on first use)."""
    if get_engine.cache_info().currsize:
        engine = get_engine()
    else:  # the first call resolves and checks the URL: blocking, so not on the loop
        engine = await run_in_threadpool(get_engine)
    # keyed by loop: a pool's connections belong to the loop that opened them (tests start several)
    key = (id(asyncio.get_running_loop()), id(engine))
    pool = _pools.get(key)
    if pool is None:
        conninfo = make_url(engine.url).set(drivername="postgresql").render_as_string(hide_password=False)
        pool = AsyncConnectionPool(conninfo, min_size=1, max_size=POOL_MAX, open=False, timeout=CONNECT_TIMEOUT_S,
                                   kwargs={"autocommit": True, "connect_timeout": int(CONNECT_TIMEOUT_S)})
        _pools[key] = pool
        await pool.open(wait=False)
    return pool


async def fetch(sql: str, params: dict[str, Any]) -> Sequence[tuple[Any, ...]]:
    """The rows of one read-only statement.

    A pooled connection that a database restart broke fails its first statement; the pool discards
    it and every other broken idle one, and the read is tried once more on a fresh one (a read can be
    repeated; nothing was written).
    A database that stays away (no connection within CONNECT_TIMEOUT_S) raises DatabaseDown.
    """
    for attempt in (1, 2):
        pool = await _pool()
        try:
            async with pool.connection() as conn, conn.cursor() as cursor:
                await cursor.execute(sql, params)
                return await cursor.fetchall()
        except PoolTimeout as exc:
            raise DatabaseDown(first_line(exc)) from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if attempt == 2:
                raise DatabaseDown(first_line(exc)) from None
            log.info("read on a broken pooled connection (%s): retrying on a fresh one", first_line(exc))
            # its idle neighbours were opened against the same server: after a restart they are all
            # dead, and each would fail one more read (check() replaces every broken idle connection)
            await pool.check()
    raise AssertionError("unreachable")


async def close_all() -> None:
    """Close every pool this loop opened (app shutdown)."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in _pools if k[0] == loop]:
        await _pools.pop(key).close()
