"""Waiting clients: N concurrent long polls on GET /runs/{id}/wait, what they cost and how soon they hear.

    .venv/bin/python benchmarks/wait_load.py [--clients 200] [--idle 45]

Creates a throw-away database, queues one run per client through POST /runs, starts `parity serve`
(no scheduler: nothing changes unless this script changes it) and has each client wait on its run as
`parity submit --wait` does (service/cli/client/waiting.py long_poll). For --idle seconds nothing
changes: the figure is requests per client per 20 s and the server's CPU. Then every run is finished
in one UPDATE (the runs trigger notifies each id at commit): the figure is how long after the commit
each client had its answer (p50, p99, max). Target (issue #43): <= 1 request per 20 s per waiting
client, each answer within 2 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import psycopg
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--idle", type=float, default=45.0)
    args = ap.parse_args()
    from benchmarks.api_load import free_port, wait_up
    from service.cli.client.waiting import long_poll
    from service.core.db import upgrade

    name = f"parity_wait_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER).set(database=name, drivername="postgresql+psycopg").render_as_string(False)
    plain = make_url(url).set(drivername="postgresql").render_as_string(False)
    server = None
    try:
        upgrade(url)
        env = {**os.environ, "PARITY_DATABASE_URL": url, "PARITY_EXECUTOR": "local",
               "PARITY_MAX_IN_FLIGHT": "100000", "PARITY_MAX_QUEUED_PER_REQUESTER": "100000"}
        token = subprocess.run([sys.executable, "-m", "service.cli.main", "token", "create", "--name", "bench",
                                "--scope", "submit", "--track", "*"], env=env, capture_output=True, text=True,
                               check=True, cwd=ROOT).stdout.strip()
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--port", str(port)],
                                  env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        wait_up(f"{base}/api/v1/healthz")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            runs = [client.post("/api/v1/runs", json={"spec": SPEC}).json() for _ in range(args.clients)]
        requests = [0] * args.clients
        answered: list[float | None] = [None] * args.clients
        stop_at = time.monotonic() + args.idle + 60

        def wait(i: int) -> None:
            run = runs[i]
            with httpx.Client(base_url=base, timeout=60) as client:
                while run["state"] == "queued" and time.monotonic() < stop_at:
                    requests[i] += 1
                    run = long_poll(client, f"/api/v1/runs/{run['id']}/wait", after=run["state_version"],
                                    deadline=stop_at)
            answered[i] = time.monotonic()

        proc = psutil.Process(server.pid)
        threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # every client's first request is in
        cpu0, sent0, t0 = sum(proc.cpu_times()[:2]), sum(requests), time.monotonic()
        time.sleep(args.idle)
        cpu1, sent1, t1 = sum(proc.cpu_times()[:2]), sum(requests), time.monotonic()
        per_client_20s = (sent1 - sent0) / args.clients / (t1 - t0) * 20
        print(f"{args.clients} waiting clients, {t1 - t0:.0f} s idle: {(sent1 - sent0) / (t1 - t0):.1f} req/s in all, "
              f"{per_client_20s:.2f} requests per client per 20 s; server CPU {100 * (cpu1 - cpu0) / (t1 - t0):.1f}% "
              f"of a core")
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute("UPDATE runs SET state = 'cancelled', state_version = state_version + 1")
            committed = time.monotonic()
        for t in threads:
            t.join(90)
        late = sorted((a - committed) for a in answered if a is not None)
        print(f"after one commit finishing every run: {len(late)}/{args.clients} answered; "
              f"p50 {statistics.median(late):.2f} s, p99 {late[int(0.99 * (len(late) - 1))]:.2f} s, "
              f"max {late[-1]:.2f} s")
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
