"""Where a POST /runs and a GET /runs/{id} spend their time, without HTTP and then with it.

    .venv/bin/python benchmarks/api_profile.py [--runs 100000] [--requests 500] [--top 25]

Creates a throw-away database (PARITY_BENCH_SERVER_URL, default the local Postgres), seeds it like
api_load.py, then times each request's parts by calling the route functions in this process (one
thread, so cProfile sees everything): the session and its transaction, token check, default
environment, the INSERTs, the commit, building the response model, and JSON encoding. Finally it
runs the same requests through FastAPI's ASGI app in-process (no sockets) to show what the framework
adds, and prints cProfile's top functions for the POST path. Drops the database.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}


CPU: dict[str, float] = {}


def timed(label: str, fn: Callable[[], Any], n: int, out: dict[str, float]) -> None:
    """Median wall milliseconds of fn over n calls, stored under label (mean CPU ms of this process in CPU)."""
    samples = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    CPU[label] = (time.process_time() - cpu0) * 1000 / n
    out[label] = statistics.median(samples) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    from api_load import SEED_SQL  # type: ignore[import-not-found]

    name = f"parity_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER).set(database=name, drivername="postgresql+psycopg").render_as_string(False)
    plain = make_url(url).set(drivername="postgresql").render_as_string(False)
    try:
        from service.core.db import upgrade

        upgrade(url)
        with psycopg.connect(plain, autocommit=True) as conn:
            for statement in filter(str.strip, SEED_SQL.split(";")):
                conn.execute(statement, {"n": args.runs, "python": sys.executable})
        os.environ.update(PARITY_DATABASE_URL=url, PARITY_EXECUTOR="local",  # no scheduler drains the queue here
                          PARITY_MAX_IN_FLIGHT="1000000", PARITY_MAX_QUEUED_PER_REQUESTER="1000000")
        profile(args, plain)
    finally:
        from service.core.db import reset_engine

        reset_engine()
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


def profile(args: argparse.Namespace, plain: str) -> None:
    """Time the parts, then the whole through ASGI, then print cProfile's view of the POST path."""
    from service.core.db import session_scope
    from service.core.schemas import RunCreate
    from service.core.settings import get_settings
    from service.core.tokens import authenticate, create_token
    from service.environments.registry import ensure_default_environment
    from service.runs import api as routes
    from service.runs.records import create_run, get_run
    from service.web.app import create_app

    settings = get_settings()
    with session_scope() as session:
        token = create_token(session, name="bench", scopes=["submit"], tracks=["*"])
    n = args.requests
    parts: dict[str, float] = {}
    with psycopg.connect(plain, autocommit=True) as conn:
        timed("psycopg: SELECT 1 round trip", lambda: conn.execute("SELECT 1").fetchone(), n, parts)

    def empty_tx() -> None:
        with session_scope():
            pass

    def pk_lookup() -> None:
        with session_scope() as session:
            get_run(session, run_id=1 + (time.perf_counter_ns() % args.runs), with_phases=True)

    def auth() -> None:
        with session_scope() as session:
            authenticate(session, token=token, scope="submit")

    body = RunCreate.model_validate({"spec": SPEC, "labels": {"branch": "bench"}})

    def post_service() -> None:
        with session_scope() as session:
            tok = authenticate(session, token=token, scope="submit")
            env = ensure_default_environment(session, settings=settings)
            run, _ = create_run(session, spec=body.spec.run_spec, environment=env, labels=body.labels,
                                requester=tok.name)
            routes.run_out(run, "http://127.0.0.1:8000").model_dump_json()

    def get_service() -> None:
        with session_scope() as session:
            run = get_run(session, run_id=1 + (time.perf_counter_ns() % args.runs), with_phases=True)
            routes.run_out(run, "http://127.0.0.1:8000", with_phases=True).model_dump_json()

    timed("transaction: open, commit, close", empty_tx, n, parts)
    timed("token check (SELECT by hash)", auth, n, parts)
    timed("GET: run + environment + phases", pk_lookup, n, parts)
    timed("GET: service + response JSON", get_service, n, parts)
    timed("POST: service + response JSON", post_service, n, parts)

    app = create_app()
    headers = {"Authorization": f"Bearer {token}"}

    async def through_asgi(method: str, count: int) -> float:
        cpu0 = time.process_time()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            samples = []
            for _ in range(count):
                t0 = time.perf_counter()
                if method == "POST":
                    r = await client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"b": "x"}}, headers=headers)
                    assert r.status_code == 202, r.text
                else:
                    r = await client.get(f"/api/v1/runs/{1 + (time.perf_counter_ns() % args.runs)}")
                    assert r.status_code == 200, r.text
                samples.append(time.perf_counter() - t0)
            CPU[f"{method}: whole request via ASGI (no sockets)"] = (time.process_time() - cpu0) * 1000 / count
            return statistics.median(samples) * 1000

    parts["POST: whole request via ASGI (no sockets)"] = asyncio.run(through_asgi("POST", n))
    parts["GET: whole request via ASGI (no sockets)"] = asyncio.run(through_asgi("GET", n))
    print(f"median wall ms and mean CPU ms (this process) per call over {n} calls ({args.runs} runs stored):")
    for label, ms in parts.items():
        print(f"  {label:<45} wall {ms:7.3f}  cpu {CPU.get(label, float('nan')):7.3f}")
    # CPU time, not wall time: a busy machine stretches waits on Postgres but not this process's work
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    for _ in range(n):
        post_service()
    prof.disable()
    print(f"\ncProfile (CPU time) of {n} POSTs through the service layer (own time, top {args.top}):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    sys.exit(main())
