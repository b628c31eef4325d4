"""Chaos benchmark: a bounded load through the real API, scheduler and Slurm while faults are injected.

    source /var/tmp/parity-slurm/env.sh
    .venv/bin/python benchmarks/chaos.py [--runs 12] [--clients 4] [--spacing 6] [--timeout 2400] [--keep]

A private Postgres (initdb + pg_ctl on a free port; never the shared server), `parity serve`, two
`parity scheduler` replicas and the shared single-node Slurm. Clients submit a mix of known-good and
known-bad runs (plus one whose rank reports a NaN loss and one whose rank is killed mid-phase)
with Idempotency-Keys, retrying on 5xx/connection errors, while the schedule below injects faults:
garbage requests, a second scheduler replica, SIGKILL of each replica, scancel of a running phase,
sbatch refusing jobs for a while, and a Postgres restart. It prints (and writes chaos.json):
accepted, right verdict, lost, submitted twice, server 5xx outside the Postgres window, longest
queue stall and the time to recover from each fault.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo's packages
from benchmarks.chaos_parts import (  # noqa: E402
    PARITY,
    REPO,
    PrivatePostgres,
    Proc,
    SbatchSwitch,
    fault_python,
    free_port,
    wait_until,
)
from benchmarks.chaos_report import report  # noqa: E402

GOOD = ["realign-param-index", "restore-adam-step"]
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 4, "save_step": 2}
# what each kind of run must end as (a run given a fault may legitimately end in error)
EXPECTED = {"good": {"passed"}, "bad": {"failed"}, "nan": {"failed", "error"}, "kill": {"error", "failed"}}


class Recorder:
    """Every HTTP answer the clients got (time, status), and events of the fault schedule."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: list[tuple[float, int, str]] = []
        self.faults: dict[str, dict[str, Any]] = {}
        self.accepted: dict[int, dict[str, Any]] = {}

    def answer(self, status: int, what: str) -> None:
        """Record one HTTP answer (0: no answer at all)."""
        with self.lock:
            self.answers.append((time.time(), status, what))

    def fault(self, name: str, **info: Any) -> None:
        """Record (or extend) a fault's timing."""
        with self.lock:
            self.faults.setdefault(name, {}).update(info)


def plan(n: int) -> list[str]:
    """The kinds of the n runs: mostly good and bad alternating, one NaN and one killed rank."""
    kinds = ["good" if i % 2 == 0 else "bad" for i in range(n)]
    kinds[min(3, max(0, n - 2))] = "nan"
    kinds[min(6, n - 1)] = "kill"
    return kinds


def client(idx: int, items: list[tuple[int, str]], url: str, token: str, rec: Recorder, spacing: float,
           stop: threading.Event) -> None:
    """Submit this client's runs (retrying through outages with the same Idempotency-Key), then watch them."""
    headers = {"Authorization": f"Bearer {token}"}
    mine: list[int] = []
    with httpx.Client(base_url=url, timeout=15) as http:
        for n, kind in items:
            # the NaN and killed-rank runs are otherwise good: the fault, not the known bug, decides them
            spec = {**SPEC, "workarounds": [] if kind == "bad" else GOOD}
            body = {"spec": spec, "environment": {"nan": "chaos-nan", "kill": "chaos-kill"}.get(kind, "default"),
                    "labels": {"chaos": kind, "client": str(idx)}}
            key = f"chaos-{idx}-{n}"
            while not stop.is_set():
                try:
                    resp = http.post("/api/v1/runs", json=body, headers={**headers, "Idempotency-Key": key})
                except httpx.HTTPError:
                    rec.answer(0, "POST /runs")
                    time.sleep(1)
                    continue
                rec.answer(resp.status_code, "POST /runs")
                if resp.status_code == 202:
                    run = resp.json()
                    with rec.lock:
                        rec.accepted[run["id"]] = {"kind": kind, "client": idx, "at": time.time()}
                    mine.append(run["id"])
                    break
                if resp.status_code < 500 and resp.status_code != 429:
                    raise SystemExit(f"chaos: client {idx} got {resp.status_code}: {resp.text[:300]}")
                time.sleep(1)
            stop.wait(spacing)
        while mine and not stop.is_set():  # read back like CI does, through every fault
            for run_id in list(mine):
                try:
                    resp = http.get(f"/api/v1/runs/{run_id}")
                except httpx.HTTPError:
                    rec.answer(0, "GET /runs/{id}")
                    continue
                rec.answer(resp.status_code, "GET /runs/{id}")
                if resp.status_code == 200 and resp.json()["finished_at"]:
                    mine.remove(run_id)
            stop.wait(3)


def garbage(url: str, admin: str, rec: Recorder) -> dict[str, int]:
    """Malformed and hostile requests: each must be a 4xx, never a 5xx, never stored."""
    h = {"Authorization": f"Bearer {admin}"}
    cases = {
        "binary body": lambda c: c.post("/api/v1/runs", content=os.urandom(2048), headers={**h, "Content-Type":
                                                                                           "application/json"}),
        "100 KiB body": lambda c: c.post("/api/v1/runs", json={"spec": SPEC, "labels": {"x": "y" * 100_000}},
                                         headers=h),
        "40 labels": lambda c: c.post("/api/v1/runs", json={"spec": SPEC, "labels": {f"k{i}": "v" for i in
                                                                                     range(40)}}, headers=h),
        "config []": lambda c: c.post("/api/v1/runs", json={"spec": {**SPEC, "config": []}}, headers=h),
        "no such environment": lambda c: c.post("/api/v1/runs", json={"spec": SPEC, "environment": "nope"},
                                                headers=h),
        "long python": lambda c: c.post("/api/v1/environments", json={"name": "x", "python": "/" + "p" * 5000},
                                        headers=h),
        "page=²": lambda c: c.get("/runs", params={"page": "²"}),
        "huge id": lambda c: c.get("/api/v1/runs/99999999999999"),
        "no token": lambda c: c.post("/api/v1/runs", json={"spec": SPEC}),
    }
    out = {}
    with httpx.Client(base_url=url, timeout=15) as http:
        for name, call in cases.items():
            status = call(http).status_code
            rec.answer(status, f"garbage: {name}")
            out[name] = status
    return out


def scancel_running(db: str, rec: Recorder, timeout: float = 600) -> None:
    """scancel the Slurm job of a phase that is running (an operator or preemption killing it)."""
    def running() -> tuple[int, str, str, int] | None:
        with psycopg.connect(db, connect_timeout=3) as conn:
            return conn.execute(
                "select run_id, name, job_id, attempt from phases where state = 'running' and executor = 'slurm' "
                "order by id limit 1").fetchone()

    found: list[Any] = []

    def seen() -> bool:
        found.append(running())
        return bool(found[-1])

    wait_until(seen, timeout, "a running phase to scancel", every=1)
    run_id, name, job_id, attempt = found[-1]
    subprocess.run(["scancel", job_id], check=False, timeout=30)
    rec.fault("scancel a running phase", at=time.time(), run_id=run_id, phase=name, job_id=job_id, attempt=attempt)


def kill_and_restart(ctx: dict[str, Any], key: str, name: str, rec: Recorder) -> None:
    """SIGKILL one scheduler replica, start a new one 3 s later, and time until it is beating."""
    proc: Proc = ctx[key]
    proc.kill()
    killed = time.time()
    rec.fault(name, at=killed, replica=key)
    time.sleep(3)
    proc.start()
    assert proc.proc is not None
    beat = f"{socket.gethostname()}:{proc.proc.pid}"

    def beating() -> bool:
        with psycopg.connect(ctx["db"], connect_timeout=3) as conn:
            return conn.execute("select 1 from scheduler_heartbeats where name = %s", (beat,)).fetchone() is not None

    wait_until(beating, 300, f"the restarted {key} to beat")
    rec.fault(name, back_s=round(time.time() - killed, 1))


def schedule(ctx: dict[str, Any], rec: Recorder, stop: threading.Event) -> None:
    """The fault schedule (seconds after the first submission)."""
    t0 = time.time()

    def at(t: float) -> bool:
        return not stop.wait(max(0.0, t0 + t - time.time()))

    if at(8):
        rec.fault("garbage requests", at=time.time(), statuses=garbage(ctx["url"], ctx["admin"], rec))
    if at(15):
        ctx["sched_b"].start()
        rec.fault("two scheduler replicas", at=time.time())
    if at(35):
        kill_and_restart(ctx, "sched_a", "SIGKILL scheduler (1st)", rec)
    if at(45):
        scancel_running(ctx["db"], rec)
    if at(90):
        ctx["sbatch"].down()
        rec.fault("sbatch fails", at=time.time())
        time.sleep(25)
        ctx["sbatch"].up()
        rec.fault("sbatch fails", until=time.time())
    if at(140):
        rec.fault("Postgres restart", at=time.time())
        ctx["pg"].stop()
        time.sleep(8)
        ctx["pg"].start()
        rec.fault("Postgres restart", until=time.time())
        ok = wait_until(lambda: httpx.get(f"{ctx['url']}/api/v1/healthz", timeout=3).status_code == 200, 120,
                        "the API to answer after the Postgres restart")
        rec.fault("Postgres restart", api_back_s=round(ok, 1))
    if at(185):
        kill_and_restart(ctx, "sched_b", "SIGKILL scheduler (2nd)", rec)


def job_ids_by_folder(runs: Path) -> dict[str, set[str]]:
    """Slurm job ids submitit left in each phase folder (<id>_submitted.pkl, <id>_<task>_log.out)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in runs.rglob("*"):
        m = re.match(r"^(\d+)(?:_submitted\.pkl|_\d+_log\.(?:out|err))$", path.name)
        if m:
            found[str(path.parent)].add(m.group(1))
    return found


def main() -> int:
    """Run the benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--spacing", type=float, default=6.0, help="seconds between one client's submissions")
    ap.add_argument("--timeout", type=float, default=2400)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, database files)")
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("chaos: SLURM_CONF unset (source /var/tmp/parity-slurm/env.sh)")
    work = Path(tempfile.mkdtemp(prefix="parity-chaos-"))
    work.chmod(0o711)  # the private Postgres runs as `postgres` under it
    print(f"chaos: work folder {work}", flush=True)
    pg, sbatch = PrivatePostgres(work), SbatchSwitch(work)
    procs: list[Proc] = []
    stop = threading.Event()
    try:
        pg.init()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "PARITY_DATABASE_URL": pg.url, "PARITY_EXECUTOR": "slurm",
               "PARITY_RUN_FOLDER": str(work / "runs"), "PARITY_DATA_DIR": str(work / "data"),
               "PARITY_JOB_PYTHON": PARITY[0], "PARITY_SCHEDULER_POLL_SECONDS": "1",
               "PARITY_MAX_INFRA_RETRIES": "5", "PARITY_RETRY_BACKOFF_SECONDS": "3",
               "PARITY_SLURM_TIME_LIMIT_MIN": "10", "PARITY_PUBLIC_URL": url, "PYTHONPATH": str(REPO)}
        sched_env = {**env, "PATH": f"{sbatch.dir}{os.pathsep}{env['PATH']}"}
        subprocess.run([*PARITY, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=300)

        def token(name: str, scope: str) -> str:
            return subprocess.run([*PARITY, "token", "create", "--name", name, "--scope", scope, "--track", "*"],
                                  env=env, check=True, capture_output=True, text=True, timeout=120).stdout.strip()

        tokens = [token(f"chaos-client-{i}", "submit") for i in range(args.clients)]
        admin = token("chaos-admin", "admin")
        api = Proc("api", ["serve", "--port", str(port)], env, work)
        sched_a, sched_b = Proc("scheduler-a", ["scheduler"], sched_env, work), Proc("scheduler-b", ["scheduler"],
                                                                                      sched_env, work)
        procs += [api, sched_a, sched_b]
        api.start()
        wait_until(lambda: httpx.get(f"{url}/api/v1/healthz", timeout=3).status_code in (200, 503), 120, "the API")
        for mode in ("nan", "kill"):
            resp = httpx.post(f"{url}/api/v1/environments", headers={"Authorization": f"Bearer {admin}"},
                              json={"name": f"chaos-{mode}", "python": str(fault_python(work, mode))}, timeout=300)
            assert resp.status_code == 201, resp.text
        sched_a.start()
        rec = Recorder()
        db = make_url(pg.url).set(drivername="postgresql").render_as_string(hide_password=False)
        ctx = {"url": url, "admin": admin, "db": db, "pg": pg, "sbatch": sbatch, "sched_a": sched_a,
               "sched_b": sched_b}
        kinds = list(enumerate(plan(args.runs)))
        started = time.time()
        threads = [threading.Thread(target=client, args=(i, kinds[i::args.clients], url, tokens[i], rec,
                                                         args.spacing, stop)) for i in range(args.clients)]
        faults = threading.Thread(target=schedule, args=(ctx, rec, stop))
        for t in [*threads, faults]:
            t.start()
        deadline = started + args.timeout
        for t in threads:
            t.join(max(1.0, deadline - time.time()))
        stop.set()
        faults.join(timeout=300)
        ended = time.time()
        result = report(db, rec, started, ended, EXPECTED, job_ids_by_folder(work / "runs"), work)
        (work / "chaos.json").write_text(json.dumps(result, indent=2, default=str))
        print(result["table"], flush=True)
        print(f"chaos: details in {work / 'chaos.json'}", flush=True)
        return 0 if result["ok"] else 1
    finally:
        stop.set()
        sbatch.up()
        for proc in procs:
            proc.kill(15)
        _cancel_leftovers(work)
        try:
            pg.stop()
        except Exception:  # noqa: BLE001 - already stopped
            pass
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _cancel_leftovers(work: Path) -> None:
    """scancel any of this benchmark's jobs still queued or running (never anyone else's)."""
    ids = sorted({i for ids in job_ids_by_folder(work / "runs").values() for i in ids})
    if ids:
        subprocess.run(["scancel", *ids], check=False, timeout=60)


if __name__ == "__main__":
    raise SystemExit(main())
