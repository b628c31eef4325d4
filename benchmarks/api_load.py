"""API load benchmark: POST /runs and GET /runs/{id} on loopback with 1M runs already stored.

    .venv/bin/python benchmarks/api_load.py [--runs 1000000] [--requests 3000] [--seconds 20]
                                             [--concurrency 4] [--workers 1] [--repeat 1]
                                             [--client wrk|httpx] [--connections 16] [--rate 500]

Creates a throw-away database on PARITY_BENCH_SERVER_URL (default: the local Postgres), seeds it
in SQL, starts `parity serve` against it, drives it with a bounded number of requests in bounded
time, prints throughput and p50/p99 latency per endpoint, and drops the database.

The floor: a bare FastAPI app (one sync and one async endpoint returning a small JSON object, no
database) served by the same uvicorn settings in the same run and driven by the same client.
Each endpoint is also reported as a fraction of the floor's throughput, so a noisy shared
machine shows up in the floor rather than as a regression of the service.
The client: wrk (Debian's `wrk`, one thread, --connections keep-alive connections) where it is
installed, else httpx threads in this process. With wrk each line also gives the CPU milliseconds the
server's processes and the Postgres backends spent per request (read from /proc, so a busy machine
inflates wall times but not these), and "cap" = cores x 1000 / (server + Postgres CPU ms): the
throughput this machine could give if only the service and Postgres ran.
--rate R adds two drives at a fixed offered load of at most R req/s (the floor and GET /runs/{id}): at
saturation every request also waits for the ones queued before it, so a saturation p99 is mostly
queueing (the bare floor's own is 20-40 ms here); a p99 at a stated rate is the latency a caller sees.
--suite-checks N (default 12) also times POST /suite-runs of one N-check suite, one at a time (p50, p95).
Targets on a 2-core machine (issue #43: what the product needs, PARITY_MAX_IN_FLIGHT=500 and checks of
10-55 s): POST /runs >= 100 req/s; one suite POST of 12 checks <= 100 ms p95; GET /runs/{id} p99 <= 50 ms
at 100 req/s offered.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import history_summary
import httpx
import psycopg
import wrk_driver
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}

SEED_SQL = """
INSERT INTO environments (name, python, description, packages, created_at)
VALUES ('default', %(python)s, 'bench', '{}', now());
SET session_replication_role = replica;
INSERT INTO runs (config, spec, environment_id, labels, state, state_version, updated_at, cancel_requested,
                  verdict, signatures, summary, regression, created_at, finished_at, max_abs_loss_delta,
                  check_key, check_name, track)
SELECT (ARRAY['moe-fp32-router','moe-fp32-router-gates','dense-bf16'])[1 + i %% 3],
       jsonb_build_object('config', (ARRAY['moe-fp32-router','moe-fp32-router-gates','dense-bf16'])[1 + i %% 3],
                          'dp', 2, 'steps', 20, 'save_step', 10, 'sharding', 'dp_reshardable', 'seed', 1234,
                          'tolerance', 'default', 'workarounds', '[]'::jsonb),
       1, jsonb_build_object('branch', 'main', 'commit', md5(i::text)), 'passed', 6, now(), false,
       CASE WHEN i %% 7 = 0 THEN 'fail' ELSE 'pass' END, '[]', '{}', false,
       now() - (i || ' minutes')::interval, now() - (i || ' minutes')::interval, 0.0,
       substr(md5((1 + i %% 3)::text), 1, 16),
       (ARRAY['moe-fp32-router','moe-fp32-router-gates','dense-bf16'])[1 + i %% 3], 'main'
FROM generate_series(1, %(n)s) AS i;
RESET session_replication_role;
""" + history_summary.backfill_sql() + """;
ANALYZE;
"""
# The runs go in with triggers off (session_replication_role = replica): the per-row history_summary
# trigger made one INSERT of 1M rows take over half an hour, rewriting the same three summary rows a
# million times; the summary is then built in one statement, migration 0014's backfill.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


BARE_APP = """
from fastapi import FastAPI
app = FastAPI()

@app.get("/bare/sync")
def bare_sync() -> dict:
    return {"id": 1, "state": "queued"}

@app.get("/bare/async")
async def bare_async() -> dict:
    return {"id": 1, "state": "queued"}
"""


def start_bare(port: int, workers: int, root: Path) -> subprocess.Popen[bytes]:
    """Serve the bare app with uvicorn as `parity serve` does (same workers, same log level)."""
    (root / "bare_app.py").write_text(BARE_APP)
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bare_app:app", "--port", str(port), "--workers", str(workers),
         "--log-level", "warning", "--no-access-log"],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_up(url: str) -> None:
    """Wait until url answers 200."""
    for _ in range(300):
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def drive(name: str, call, requests: int, seconds: float, concurrency: int) -> dict[str, float]:
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
    return {
        "requests": len(latencies), "wall_s": wall, "rps": len(latencies) / wall, "errors": errors,
        "p50_ms": statistics.median(latencies) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def report(name: str, runs: list[dict[str, float]], floor: float | None) -> None:
    """Print the median figures of repeated drives of one endpoint."""
    rps = statistics.median(r["rps"] for r in runs)
    p50 = statistics.median(r["p50_ms"] for r in runs)
    p99 = statistics.median(r["p99_ms"] for r in runs)
    errors = sum(int(r["errors"]) for r in runs)
    share = f"  {rps / floor:5.2f} of floor" if floor else ""
    cpu = ""
    if "server_cpu_ms" in runs[0]:
        srv = statistics.median(r["server_cpu_ms"] for r in runs)
        pg = statistics.median(r["postgres_cpu_ms"] for r in runs)
        cap = (os.cpu_count() or 1) * 1000 / (srv + pg)
        cpu = f"  cpu/req: server {srv:5.2f} ms + postgres {pg:5.2f} ms (cap {cap:6.0f} req/s)"
    print(f"{name:<24} {rps:8.1f} req/s  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  errors {errors}{share}{cpu}"
          f"   (runs: {', '.join(format(r['rps'], '.0f') for r in runs)} req/s)")


def drive_with_wrk(args: argparse.Namespace, token: str, base: str, bare: str,
                   servers: list[subprocess.Popen[bytes]]) -> int:
    """The same four drives with wrk as the client, plus CPU per request on each side."""
    import json

    service_pid, bare_pid = servers[0].pid, servers[1].pid
    scripts = {
        "floor: bare sync GET": (f"{bare}/bare/sync", "", [bare_pid]),
        "floor: bare async GET": (f"{bare}/bare/async", "", [bare_pid]),
        "POST /api/v1/runs": (base, wrk_driver.POST_LUA % {"token": token, "spec": json.dumps(SPEC),
                                                           "path": "/api/v1/runs"}, [service_pid]),
        "GET /api/v1/runs/{id}": (base, wrk_driver.GET_LUA % {"path": "/api/v1/runs/", "n": args.runs},
                                  [service_pid]),
    }
    if args.rate:
        # latency at a fixed offered load (what a CI fleet polling its runs offers), beside saturation:
        # each connection waits connections/rate seconds between requests (wrk's delay()), so the
        # offered rate is at most `rate`; the achieved one is printed
        paced = wrk_driver.paced(args.rate, args.connections)
        for label in ("floor: bare sync GET", "GET /api/v1/runs/{id}"):
            url, script, pids = scripts[label]
            scripts[f"{label} @{args.rate:.0f}/s"] = (url, script + paced, pids)
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in scripts}
    for _ in range(args.repeat):  # interleaved, so a busy minute on the shared machine hits all alike
        for label, (url, script, pids) in scripts.items():
            figures[label].append(wrk_driver.drive(url, script, seconds=args.seconds,
                                                   connections=args.connections, server_pids=pids))
    floor = statistics.median(r["rps"] for r in figures["floor: bare sync GET"])
    for label, runs in figures.items():
        report(label, runs, None if label.startswith("floor") else floor)
    return 0


def time_suite_posts(base: str, env: dict[str, str], checks: int, posts: int) -> None:
    """POST /suite-runs of one suite of `checks` checks, `posts` times one after another: p50 and p95."""
    admin = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "token", "create", "--name", "bench-admin", "--scope", "admin",
         "--track", "*"], env=env, capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    headers = {"Authorization": f"Bearer {admin}"}
    suite = {"name": "bench", "description": "api_load", "checks": [
        {"name": f"check-{i}", "spec": {**SPEC, "seed": 1000 + i}} for i in range(checks)]}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        assert client.post("/api/v1/suites", json=suite).status_code in (200, 201)
        took = []
        for i in range(posts):
            body = {"suite": "bench", "labels": {"commit": f"c{i}-{uuid.uuid4().hex[:8]}", "branch": "bench"}}
            t0 = time.perf_counter()
            resp = client.post("/api/v1/suite-runs", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
            took.append((time.perf_counter() - t0) * 1000)
            assert resp.status_code in (200, 201, 202), resp.text
    took.sort()
    p95 = took[min(len(took) - 1, int(0.95 * len(took)))]
    print(f"POST /api/v1/suite-runs ({checks} checks, {posts} one at a time): p50 {statistics.median(took):.1f} ms, "
          f"p95 {p95:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="drives per endpoint (medians reported)")
    ap.add_argument("--client", choices=("wrk", "httpx"), default="wrk" if wrk_driver.available() else "httpx")
    ap.add_argument("--connections", type=int, default=16, help="wrk's keep-alive connections")
    ap.add_argument("--rate", type=float, default=0,
                    help="also drive the floor and GET /runs/{id} at this offered rate (req/s, wrk only): "
                         "latency at a stated load, beside the saturation figures")
    ap.add_argument("--suite-checks", type=int, default=12, help="checks in the suite whose POST is timed (0: none)")
    ap.add_argument("--suite-posts", type=int, default=40, help="suite POSTs timed, one at a time")
    ap.add_argument("--database", help="reuse this seeded database and keep it (seeding 1M runs takes minutes; "
                                       "a before/after pair should read the same data)")
    args = ap.parse_args()

    name = args.database or f"parity_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER).set(database=name, drivername="postgresql+psycopg").render_as_string(False)
    plain = make_url(url).set(drivername="postgresql").render_as_string(False)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        sys.path.insert(0, str(ROOT))
        from service.core.db import upgrade

        upgrade(url)
        t0 = time.perf_counter()
        with psycopg.connect(plain, autocommit=True) as conn:
            if not exists:
                for statement in filter(str.strip, SEED_SQL.split(";")):
                    conn.execute(statement, {"n": args.runs, "python": sys.executable})
            else:
                # a reused database keeps the runs earlier drives queued, which no scheduler drained:
                # settle them, or each run's admission count would read more queued runs than the last
                conn.execute("UPDATE runs SET state = 'cancelled' WHERE state = 'queued'")
            stored = conn.execute("SELECT count(*) FROM runs").fetchone()[0]  # type: ignore[index]
        print(f"{'reused' if exists else 'seeded'} database {name}: {stored} runs "
              f"({time.perf_counter() - t0:.1f}s)")
        # no scheduler drains the queue here: lift the admission caps, or POSTs would measure 429s
        env = {**os.environ, "PARITY_DATABASE_URL": url, "PARITY_EXECUTOR": "local",
               "PARITY_MAX_IN_FLIGHT": "1000000", "PARITY_MAX_QUEUED_PER_REQUESTER": "1000000"}
        token = subprocess.run(
            [sys.executable, "-m", "service.cli.main", "token", "create", "--name", "bench", "--scope", "submit",
             "--track", "*"],
            env=env, capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.strip()
        port, bare_port = free_port(), free_port()
        servers.append(subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "serve", "--port", str(port), "--workers", str(args.workers)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
        with tempfile.TemporaryDirectory(prefix="parity-bare-") as tmp:
            servers.append(start_bare(bare_port, args.workers, Path(tmp)))
            base, bare = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
            wait_up(f"{base}/api/v1/healthz")
            wait_up(f"{bare}/bare/sync")
            headers = {"Authorization": f"Bearer {token}"}
            if args.client == "wrk":
                client = f"wrk, 1 thread, {args.connections} connections, {args.seconds:.0f}s per drive"
            else:
                client = f"{args.concurrency} httpx threads in this process, bounded to {args.requests} requests / " \
                         f"{args.seconds:.0f}s per drive"
            print(f"server: {args.workers} uvicorn worker(s); client: {client}; {args.repeat} drive(s) each")

            def post(client: httpx.Client) -> bool:
                body = {"spec": SPEC, "labels": {"commit": uuid.uuid4().hex[:12], "branch": "bench"}}
                return client.post(f"{base}/api/v1/runs", json=body, headers=headers).status_code == 202

            def get(client: httpx.Client) -> bool:
                return client.get(f"{base}/api/v1/runs/{random.randint(1, args.runs)}").status_code == 200

            def bare_sync(client: httpx.Client) -> bool:
                return client.get(f"{bare}/bare/sync").status_code == 200

            def bare_async(client: httpx.Client) -> bool:
                return client.get(f"{bare}/bare/async").status_code == 200

            get(httpx.Client())  # warm-up
            if args.suite_checks:
                time_suite_posts(base, env, args.suite_checks, args.suite_posts)
            if args.client == "wrk":
                return drive_with_wrk(args, token, base, bare, servers)
            calls = {"floor: bare sync GET": bare_sync, "floor: bare async GET": bare_async,
                     "POST /api/v1/runs": post, "GET /api/v1/runs/{id}": get}
            figures = {name: [] for name in calls}  # type: dict[str, list[dict[str, float]]]
            for _ in range(args.repeat):  # interleaved, so a busy minute on the shared machine hits all alike
                for label, call in calls.items():
                    figures[label].append(drive(label, call, args.requests, args.seconds, args.concurrency))
            floor = statistics.median(r["rps"] for r in figures["floor: bare sync GET"])
            for label, runs in figures.items():
                report(label, runs, None if label.startswith("floor") else floor)
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)
        if not args.database:
            with psycopg.connect(SERVER, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
