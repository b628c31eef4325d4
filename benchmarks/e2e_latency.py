"""POST -> verdict through the real API, scheduler and executor, for N runs submitted at once.

    source /var/tmp/parity-slurm/env.sh
    .venv/bin/python benchmarks/e2e_latency.py [--sizes 1,4,16] [--executor slurm] [--repeat 1]
                                               [--config moe-fp32-router] [--dp 2] [--steps 20] [--save-step 10]
                                               [--isolation process|job] [--json]
                                               [--warm | --both] [--pool-size 1] [--nodes 1,2]

Creates a throw-away database on PARITY_BENCH_SERVER_URL (default: the local Postgres), starts
`parity serve` and one `parity scheduler` against it (the scheduler's settings are the shipped
defaults unless PARITY_* variables say otherwise), measures one uninterrupted launch of the same
M steps (the `train` phase through submitit's local executor, as in parity_cost.py) as the unit,
then for each N posts N runs at once and polls them (one GET /runs?label= list request) every 50 ms x N (at most
0.5 s) until each has a verdict. Prints, per N: median and max time-to-verdict divided by the unit, and runs per minute
(N / time from the first POST to the last verdict). Target: N=1 median <= 1.6 x one launch on
single-node Slurm. Drops the database at the end.

--warm measures the warm path instead: the scheduler runs with PARITY_POOL for the default environment
(`--pool-size` workers of DP tasks), one unmeasured burst brings the workers up, and the output and
--json document are the cold one's (plus "warm", "pool" and "load_average"). --both measures cold,
then warm, in one invocation against the same unit (--json: {"cold": ..., "warm": ...}); target: warm
N=1 <= 0.8 x one launch, and N=16 at least twice the cold runs per minute. Workers are stopped at the end.

--nodes 1,2 (Slurm only) repeats everything above once per node count K on the cluster SLURM_CONF
names (the namespaces cluster of scripts/slurm-multinode-up.sh): the scheduler's jobs, pool workers
included, are kept off every node but the first K (`exclude=` in PARITY_SLURM_EXTRA_ARGS), the pool
has --pool-size workers per node (K x --pool-size), and before each mode the benchmark waits until
no job of its own is left on the cluster. Output lines start with `nodes=K`; --json is
{"nodes=K": <the document above>, ...} plus "node_cpus". Nodes that share one machine share its
cores: declare each node's CPUs (PARITY_SLURM2_CPUS) so that K nodes hold no more than the host has,
or the growth measured is oversubscription. Example, on 2 cores:

    PARITY_SLURM2_CPUS=1 scripts/slurm-multinode-up.sh --nodes 2; source /var/tmp/parity-slurm2/env.sh
    .venv/bin/python benchmarks/e2e_latency.py --nodes 1,2 --both --sizes 6 --dp 1 --steps 6 --save-step 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import wrk_driver
from e2e_nodes import cluster_nodes, only_first_nodes, print_node_table, wait_jobs_gone, wait_pool_idle
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TERMINAL = {"passed", "failed", "error", "cancelled"}
GOOD = ["realign-param-index", "restore-adam-step"]


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_launch(spec: dict[str, Any], root: Path, repeat: int) -> float:
    """Median wall time of one uninterrupted launch (train phase, M steps) after a warm-up."""
    from jobs.launch.local import launch_phase
    from jobs.spec import RunSpec

    run_spec = RunSpec.from_dict(spec)
    times = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        doc = launch_phase(run_spec, root / f"unit{i}", "uninterrupted")
        if doc["status"] != "ok":
            raise SystemExit(f"uninterrupted launch failed: {doc.get('error')}")
        if i:  # the first is a warm-up (page cache, .pyc files)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _notice_delays(run_root: Path, doc: dict[str, Any]) -> list[float]:
    """Per finished phase: from its last rank document landing on disk to the scheduler closing it."""
    out = []
    for phase in doc.get("phases") or []:
        found = (run_root / f"run-{doc['id']}").rglob("result.rank*.json")
        # <run>/<phase>/result.rank*.json, or per attempt <run>/<phase>/attempt-<n>/result.rank*.json
        files = [p for p in found if phase["name"] in (p.parent.name, p.parent.parent.name)]
        if files and phase.get("ended_at"):
            written = max(p.stat().st_mtime for p in files)
            out.append(datetime.fromisoformat(phase["ended_at"]).timestamp() - written)
    return out


def _timeline(doc: dict[str, Any]) -> dict[str, float]:
    """Where one run's time went, from the timestamps the API returns: POST -> first phase submitted,
    each phase's submitted -> started (the executor or worker taking it up) and started -> ended,
    the gap between one phase ending and the next being submitted, last phase ended -> verdict."""
    out: dict[str, float] = {}
    ok = sorted((p for p in doc.get("phases") or [] if p.get("state") == "succeeded"),
                key=lambda p: p.get("submitted_at") or "")
    if not ok or not doc.get("finished_at"):
        return out
    out["post_to_submitted"] = _seconds(doc["created_at"], ok[0]["submitted_at"])
    for prev, phase in zip([None, *ok], ok, strict=False):
        name = phase["name"]
        if phase.get("submitted_at") and phase.get("started_at"):
            out[f"{name}.pickup"] = _seconds(phase["submitted_at"], phase["started_at"])
        if phase.get("started_at") and phase.get("ended_at"):
            out[f"{name}.run"] = _seconds(phase["started_at"], phase["ended_at"])
        if prev is not None and prev.get("ended_at") and phase.get("submitted_at"):
            out[f"{prev['name']}->{name}"] = _seconds(prev["ended_at"], phase["submitted_at"])
    if ok[-1].get("ended_at"):
        out["ended_to_verdict"] = _seconds(ok[-1]["ended_at"], doc["finished_at"])
    return out


def burst(
    base: str, headers: dict[str, str], body: dict[str, Any], n: int, timeout: float, run_root: Path
) -> dict[str, Any]:
    """Post n runs at once, wait for every verdict, return the per-run latencies."""
    posted: dict[int, float] = {}
    tag = uuid.uuid4().hex[:12]  # the burst's label: one list request polls all of its runs

    def post(i: int) -> tuple[int, float]:
        with httpx.Client(timeout=30) as client:
            t0 = time.perf_counter()
            labeled = {**body, "labels": {**body["labels"], "commit": uuid.uuid4().hex[:12], "burst": tag}}
            resp = client.post(f"{base}/api/v1/runs", json=labeled, headers=headers)
            resp.raise_for_status()
            return int(resp.json()["id"]), t0

    t_start = time.perf_counter()
    with ThreadPoolExecutor(min(n, 16)) as pool:
        for run_id, t0 in pool.map(post, range(n)):
            posted[run_id] = t0
    done: dict[int, tuple[float, str]] = {}
    docs: dict[int, dict[str, Any]] = {}
    deadline = time.perf_counter() + timeout
    with httpx.Client(timeout=30) as client:
        # One list request per 50 ms for the whole burst, not a GET per run: sixteen GETs a round from
        # a Python client cost about half a core, taken from the two the measured jobs run on.
        while len(done) < n and time.perf_counter() < deadline:
            page = client.get(f"{base}/api/v1/runs", params={"label": f"burst={tag}", "limit": n},
                              headers=headers).json()
            seen = time.perf_counter()
            for doc in page["items"]:
                run_id = int(doc["id"])
                if run_id in posted and run_id not in done and doc["state"] in TERMINAL:
                    done[run_id] = (seen - posted[run_id], doc.get("verdict") or doc["state"])
                    docs[run_id] = doc
            # 50 ms resolves one run's latency; a burst of n is polled n times less often (a list
            # request costs the server ~6 ms of CPU: at 20/s for a 70 s burst, 6% of two cores)
            time.sleep(min(0.5, 0.05 * n))
        wall = time.perf_counter() - t_start
        # the phases (for the notice delays) once, after the clock stopped: list items carry none
        docs = {run_id: client.get(f"{base}/api/v1/runs/{run_id}", headers=headers).json() for run_id in docs}
    if len(done) < n:
        raise SystemExit(f"only {len(done)} of {n} runs reached a verdict within {timeout:.0f}s")
    latencies = [t for t, _ in done.values()]
    claims = [_seconds(d["created_at"], d["submitted_at"]) for d in docs.values() if d.get("submitted_at")]
    notices = [x for d in docs.values() for x in _notice_delays(run_root, d)]
    timelines = [_timeline(d) for d in docs.values()]
    keys = dict.fromkeys(k for t in timelines for k in t)  # first seen order: the run's own order
    return {
        "timeline_s": {k: round(statistics.median(t[k] for t in timelines if k in t), 3) for k in keys},
        "claim_s": sorted(round(x, 3) for x in claims),
        "notice_s": sorted(round(x, 3) for x in notices),
        "n": n,
        "latencies_s": sorted(round(t, 3) for t in latencies),
        "verdicts": sorted({v for _, v in done.values()}),
        "median_s": statistics.median(latencies),
        "max_s": max(latencies),
        "runs_per_minute": 60.0 * n / wall,
    }


def start_service(procs: list[subprocess.Popen[bytes]], env: dict[str, str], root: Path) -> str:
    """Start `parity serve` and one scheduler with env; wait until the scheduler beats; the base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(root / "service.log", "ab")
    for cmd in (["serve", "--port", str(port)], ["scheduler"]):
        procs.append(subprocess.Popen([sys.executable, "-m", "service.cli.main", *cmd], env=env, cwd=ROOT,
                                      stdout=log, stderr=log))
    for _ in range(300):
        try:
            if httpx.get(f"{base}/api/v1/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    # the clock starts at a POST to a running scheduler, not one still importing
    for _ in range(600):
        health = httpx.get(f"{base}/api/v1/healthz", timeout=1).json()
        if (health.get("scheduler") or {}).get("executor") and _fresh(health):
            break
        time.sleep(0.1)
    return base


def _fresh(health: dict[str, Any]) -> bool:
    beat = (health.get("scheduler") or {}).get("last_heartbeat")
    return bool(beat) and (datetime.now().astimezone() - datetime.fromisoformat(str(beat))).total_seconds() < 5


def _service_cpu(procs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """CPU seconds the server and the scheduler have used so far (with their children: uvicorn's
    workers, the local executor's jobs)."""
    names = ("server", "scheduler")
    return {name: wrk_driver.cpu_seconds([proc.pid]) for name, proc in zip(names, procs, strict=False)}


def stop_pool(run_folder: Path) -> None:
    """Stop every pool worker left (a stop order, or its job cancelled): they hold the node's CPUs."""
    from service.core.settings import Settings
    from service.executors import pool

    for worker in pool.list_workers(Settings(run_folder=run_folder)):
        pool.retire(worker, "benchmark over", hard=False)


def stop_service(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop the server and the scheduler (a stopped scheduler leaves its pool workers to their idle exit)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=60)
    procs.clear()










def measure(
    args: argparse.Namespace, mode: str, env: dict[str, str], procs: list[subprocess.Popen[bytes]], root: Path,
    spec: dict[str, Any], unit: float, headers: dict[str, str], label: str = "", pool_size: int | None = None,
) -> dict[str, Any]:
    """One mode (cold or warm): start the service, burst each size --repeat times, stop it; the summary."""
    sizes = [int(x) for x in args.sizes.split(",") if x]
    body = {"spec": spec, "labels": {"branch": "bench"}}
    size = args.pool_size if pool_size is None else pool_size
    pool = f"env=default:tasks={args.dp}:size={size}:idle=600" if mode == "warm" else ""
    if args.executor == "slurm":
        wait_jobs_gone(root / "runs")
    base = start_service(procs, {**env, "PARITY_POOL": pool}, root)
    if mode == "warm":
        # the pool starts on demand: one unmeasured run per worker brings them up (and leaves them
        # idle, waiting), as they are between runs in steady use
        burst(base, headers, body, size, args.timeout, root / "runs")
        wait_pool_idle(root / "runs", size)
    results = []
    for n in sizes:
        rounds = []
        for _ in range(args.repeat):
            before = _service_cpu(procs)
            rounds.append(burst(base, headers, body, n, args.timeout, root / "runs"))
            rounds[-1]["service_cpu_s"] = {k: round(v - before[k], 2) for k, v in _service_cpu(procs).items()}
        results.append({
            "n": n,
            "median_x": statistics.median(r["median_s"] for r in rounds) / unit,
            "max_x": statistics.median(r["max_s"] for r in rounds) / unit,
            "runs_per_minute": statistics.median(r["runs_per_minute"] for r in rounds),
            "verdicts": sorted({v for r in rounds for v in r["verdicts"]}),
            "claim_s_median": statistics.median(x for r in rounds for x in r["claim_s"] or [float("nan")]),
            "notice_s_median": statistics.median(
                x for r in rounds for x in r["notice_s"] or [float("nan")]),
            "load_average": list(os.getloadavg()),
            "rounds": rounds,
        })
        if not args.json:
            r = results[-1]
            print(f"{label}{mode} N={n:<3} median {r['median_x']:.2f}x  max {r['max_x']:.2f}x  "
                  f"{r['runs_per_minute']:.1f} runs/min  verdicts {','.join(r['verdicts'])}  "
                  f"(median {statistics.median(x['median_s'] for x in rounds):.1f} s); "
                  f"POST->claimed median {r['claim_s_median'] * 1000:.0f} ms, "
                  f"result file->phase closed median {r['notice_s_median'] * 1000:.0f} ms; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            print(f"{label}{mode} N={n:<3} service CPU in the burst (s): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1]["service_cpu_s"].items()), flush=True)
            print(f"{label}{mode} N={n:<3} timeline (median s): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in rounds[-1]["timeline_s"].items()), flush=True)
    summary = {"spec": spec, "executor": args.executor, "one_launch_s": unit, "warm": mode == "warm", "pool": pool,
               "load_average": list(os.getloadavg()), "sizes": results}
    stop_service(procs)
    stop_pool(root / "runs")
    return summary




def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--executor", default="slurm", choices=("slurm", "local"))
    ap.add_argument("--repeat", type=int, default=1, help="bursts per size (medians reported)")
    ap.add_argument("--config", default="moe-fp32-router")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-step", type=int, default=10)
    ap.add_argument("--isolation", help="spec isolation mode (omitted: the service's default)")
    ap.add_argument("--unit-repeat", type=int, default=2, help="uninterrupted launches for the unit")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--warm", action="store_true", help="measure the warm path (PARITY_POOL for the environment)")
    ap.add_argument("--both", action="store_true", help="cold, then warm, in this one invocation")
    ap.add_argument("--pool-size", type=int, default=1,
                    help="warm workers (each holds DP ranks' CPUs); per node with --nodes")
    ap.add_argument("--nodes", default="", help="node counts to measure on SLURM_CONF's cluster, e.g. 1,2 (Slurm only)")
    args = ap.parse_args(argv)
    # a SIGTERM ends the run through `finally`: the server, the scheduler and the database go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    node_counts = [int(k) for k in args.nodes.split(",") if k]
    node_cpus: dict[str, int] = {}
    if node_counts:
        if args.executor != "slurm":
            raise SystemExit("--nodes needs --executor slurm")
        node_cpus = cluster_nodes()
        if max(node_counts) > len(node_cpus) or min(node_counts) < 1:
            raise SystemExit(f"--nodes {args.nodes}: the cluster has {len(node_cpus)} node(s) ({', '.join(node_cpus)})")
    spec: dict[str, Any] = {"config": args.config, "dp": args.dp, "steps": args.steps, "save_step": args.save_step,
                            "workarounds": GOOD}
    if args.isolation:
        spec["isolation"] = args.isolation

    name = f"parity_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER).set(database=name, drivername="postgresql+psycopg").render_as_string(False)
    procs: list[subprocess.Popen[bytes]] = []
    summaries: dict[str, Any] = {}
    modes = ["cold", "warm"] if args.both else ["warm" if args.warm else "cold"]
    root: Path | None = None
    try:
        from service.core.db import upgrade

        upgrade(url)
        with tempfile.TemporaryDirectory(prefix="parity-e2e-") as tmp:
            root = Path(tmp)
            unit = one_launch(spec, root, args.unit_repeat)
            if not args.json:
                print(f"one uninterrupted launch (unit): {unit:.2f} s; executor {args.executor}; "
                      f"{args.repeat} burst(s) per size, medians", flush=True)
                if node_counts:
                    print(f"nodes {', '.join(f'{n} ({c} CPUs)' for n, c in node_cpus.items())}; "
                          f"{os.cpu_count()} CPUs on this host", flush=True)
            # no detector self-test: a fresh database would queue one at start-up, beside the measured runs
            env = {**os.environ, "PARITY_DATABASE_URL": url, "PARITY_EXECUTOR": args.executor,
                   "PARITY_RUN_FOLDER": str(root / "runs"), "PARITY_SELFTEST_INTERVAL_HOURS": "0"}
            token = subprocess.run(
                [sys.executable, "-m", "service.cli.main", "token", "create", "--name", "bench", "--scope", "submit",
                 "--track", "*"],
                env=env, capture_output=True, text=True, check=True, cwd=ROOT,
            ).stdout.strip()
            headers = {"Authorization": f"Bearer {token}"}
            if not node_counts:
                for mode in modes:
                    summaries[mode] = measure(args, mode, env, procs, root, spec, unit, headers)
            for k in node_counts:
                extra = only_first_nodes(list(node_cpus), k, env.get("PARITY_SLURM_EXTRA_ARGS", ""))
                per_k = {}
                for mode in modes:
                    per_k[mode] = measure(args, mode, {**env, "PARITY_SLURM_EXTRA_ARGS": extra}, procs, root, spec,
                                          unit, headers, label=f"nodes={k} ", pool_size=args.pool_size * k)
                    per_k[mode]["nodes"] = k
                summaries[f"nodes={k}"] = per_k if args.both else per_k[modes[0]]
    finally:
        stop_service(procs)
        if root is not None:
            stop_pool(root / "runs")
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if node_counts and not args.json:
        print_node_table(summaries, node_counts, modes)
    if args.json:
        if node_counts:
            json.dump({**summaries, "node_cpus": node_cpus, "host_cpus": os.cpu_count()}, sys.stdout, indent=1)
        else:
            json.dump(summaries if args.both else summaries[modes[0]], sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
