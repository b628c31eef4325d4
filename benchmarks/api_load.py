"""API load benchmark: POST /runs and GET /runs/{id} on loopback with 100k runs already stored.

    .venv/bin/python benchmarks/api_load.py [--runs 100000] [--requests 2000] [--seconds 30]
                                             [--concurrency 4] [--workers 1]

Creates a throw-away database on PARITY_BENCH_SERVER_URL (default: the local Postgres), seeds it
in SQL, starts `parity serve` against it, drives it with a bounded number of requests in bounded
time, prints throughput and p50/p99 latency per endpoint, and drops the database.
Targets on a 2-core machine: GET /runs/{id} p99 < 50 ms; POST /runs >= 200 requests/s.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}

SEED_SQL = """
INSERT INTO environments (name, python, description, packages, created_at)
VALUES ('default', %(python)s, 'bench', '{}', now());
INSERT INTO runs (config, spec, environment_id, labels, state, state_version, updated_at, cancel_requested,
                  verdict, signatures, summary, regression, created_at, finished_at, max_abs_loss_delta)
SELECT (ARRAY['moe-fp32-router','moe-fp32-router-gates','dense-bf16'])[1 + i %% 3],
       jsonb_build_object('config', (ARRAY['moe-fp32-router','moe-fp32-router-gates','dense-bf16'])[1 + i %% 3],
                          'dp', 2, 'steps', 20, 'save_step', 10, 'sharding', 'dp_reshardable', 'seed', 1234,
                          'tolerance', 'default', 'workarounds', '[]'::jsonb),
       1, jsonb_build_object('branch', 'main', 'commit', md5(i::text)), 'passed', 6, now(), false,
       CASE WHEN i %% 7 = 0 THEN 'fail' ELSE 'pass' END, '[]', '{}', false,
       now() - (i || ' minutes')::interval, now() - (i || ' minutes')::interval, 0.0
FROM generate_series(1, %(n)s) AS i;
ANALYZE;
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def drive(name: str, call, requests: int, seconds: float, concurrency: int) -> None:
    """Run call() up to `requests` times or for `seconds`, with `concurrency` threads; print figures."""
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    per_thread = max(1, requests // concurrency)

    def worker(_: int) -> tuple[list[float], int]:
        out, bad = [], 0
        with httpx.Client(timeout=10) as client:
            for _ in range(per_thread):
                if time.monotonic() > deadline:
                    break
                t0 = time.perf_counter()
                ok = call(client)
                out.append(time.perf_counter() - t0)
                bad += 0 if ok else 1
        return out, bad

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for lat, bad in pool.map(worker, range(concurrency)):
            latencies += lat
            errors += bad
    wall = time.perf_counter() - start
    print(
        f"{name:<22} {len(latencies):>6} req in {wall:6.2f}s  {len(latencies) / wall:8.1f} req/s  "
        f"p50 {statistics.median(latencies) * 1000:6.1f} ms  p99 {percentile(latencies, 0.99) * 1000:6.1f} ms"
        f"  errors {errors}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()

    name = f"parity_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER).set(database=name, drivername="postgresql+psycopg").render_as_string(False)
    plain = make_url(url).set(drivername="postgresql").render_as_string(False)
    server = None
    try:
        sys.path.insert(0, str(ROOT))
        from service.migrate import upgrade

        upgrade(url)
        t0 = time.perf_counter()
        with psycopg.connect(plain, autocommit=True) as conn:
            for statement in filter(str.strip, SEED_SQL.split(";")):
                conn.execute(statement, {"n": args.runs, "python": sys.executable})
        print(f"seeded {args.runs} runs in {time.perf_counter() - t0:.1f}s")
        env = {**os.environ, "PARITY_DATABASE_URL": url, "PARITY_EXECUTOR": "local"}
        token = subprocess.run(
            [sys.executable, "-m", "service.cli", "token", "create", "--name", "bench", "--scope", "submit"],
            env=env, capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.strip()
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", str(args.workers)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{base}/api/v1/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        headers = {"Authorization": f"Bearer {token}"}
        print(f"server: {args.workers} uvicorn worker(s); client: {args.concurrency} threads; "
              f"bounded to {args.requests} requests / {args.seconds:.0f}s per endpoint")

        def post(client: httpx.Client) -> bool:
            body = {"spec": SPEC, "labels": {"commit": uuid.uuid4().hex[:12], "branch": "bench"}}
            return client.post(f"{base}/api/v1/runs", json=body, headers=headers).status_code == 202

        def get(client: httpx.Client) -> bool:
            return client.get(f"{base}/api/v1/runs/{random.randint(1, args.runs)}").status_code == 200

        get(httpx.Client())  # warm-up
        drive("POST /api/v1/runs", post, args.requests, args.seconds, args.concurrency)
        drive("GET /api/v1/runs/{id}", get, args.requests, args.seconds, args.concurrency)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
