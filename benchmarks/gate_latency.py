"""Upload -> verdict for the gate suite (suites/gate.yaml), as a pull request's CI feels it, stage by stage.

    .venv/bin/python benchmarks/gate_latency.py [--build main|default] [--repeat 3] [--json]
    PARITY_SUITE_WARM=false .venv/bin/python benchmarks/gate_latency.py      # every check cold

Starts an API + scheduler of its own (embedded Postgres, local executor, the shipped settings unless
PARITY_* variables say otherwise; benchmarks/injected_prs.own_service) and runs
`parity submit --suite gate --wheel … --wait` once per repetition. `--build main` uploads a
megatron-core wheel built from the Megatron-LM main snapshot (Python 3.12, cached under
$PARITY_CI_CACHE as tests/service/test_gate_on_main.py caches it), with a marker file of its own
per repetition so every upload is a new build, as every pull request is; `--build default` runs on
the service's default environment (no upload, no build). The shared 3.12 torch base is prepared
before the clock starts (`parity pythons prepare 3.12`, cached beside the wheels).

Prints, per repetition, from the service's own timestamps: upload (submit -> environment
registered), environment (-> built), queue (-> the first check's first phase submitted; warm, that is
the suite's workers importing torch and Megatron-Core), each check
(its first submission -> its verdict, with its start offset), verdict (the last check's verdict ->
`parity submit` exits), and the total; then the median total and the load average before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from base64 import urlsafe_b64encode
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.injected_prs import CACHE, PARITY, own_service, stop_leftovers, wheel  # noqa: E402
from service.environments import interpreters  # noqa: E402


def marked_copy(whl: Path, out: Path, marker: str) -> Path:
    """The wheel with one file of its own added (and listed in RECORD): same code, a new content hash."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / whl.name
    body = f"# gate_latency.py run {marker}\n".encode()
    digest = urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        name = f"{record.rsplit('/', 1)[0]}/parity_bench_marker.txt"
        for item in src.infolist():
            data = src.read(item)
            if item.filename == record:
                data += f"{name},sha256={digest},{len(body)}\n".encode()
            dst.writestr(item, data)
        dst.writestr(name, body)
    return target


def _at(stamp: str | None) -> float | None:
    return None if stamp is None else datetime.fromisoformat(stamp).timestamp()


def stages(client: httpx.Client, branch: str, t0: float, t_exit: float) -> dict[str, Any]:
    """Each stage's seconds, from the runs and the environment the service recorded."""
    items = client.get("/api/v1/runs", params={"label": f"branch={branch}", "limit": 50}).json()["items"]
    runs = [client.get(f"/api/v1/runs/{r['id']}").json() for r in sorted(items, key=lambda r: r["id"])]
    env = client.get(f"/api/v1/environments/{runs[0]['environment']}").json()
    registered, built = _at(env["created_at"]), _at(env["built_at"])
    # a build this submission asked for (or the default environment, made on first use) starts at its
    # registration; an environment that was there already costs nothing here
    start = registered if registered is not None and registered >= t0 else t0
    ready = built if built is not None and built >= start else start
    checks = {}
    for run in runs:
        submitted = min(t for t in (_at(p["submitted_at"]) for p in run["phases"] or []) if t is not None)
        finished = _at(run["finished_at"]) or t_exit
        checks[run["labels"].get("suite_check", run["check_name"])] = {
            "start_s": round(submitted - t0, 1), "seconds": round(finished - submitted, 1),
            "verdict": run["verdict"],
        }
    first = min(t0 + c["start_s"] for c in checks.values())
    last = max(_at(r["finished_at"]) or t_exit for r in runs)
    return {
        "upload_s": round(start - t0, 1),
        "environment_s": round(ready - start, 1),
        "queue_s": round(first - ready, 1),
        "checks": checks,
        "verdict_s": round(t_exit - last, 1),
        "total_s": round(t_exit - t0, 1),
    }


def one_gate(url: str, token: str, whl: Path | None, branch: str, work: Path) -> dict[str, Any]:
    upload = ["--wheel", str(whl)] if whl else []
    t0 = time.time()
    done = subprocess.run(
        [*PARITY, "submit", "--url", url, "--token", token, "--suite", "gate", *upload, "--wait",
         "--junit", str(work / f"{branch}.xml"), "--label", f"branch={branch}", "--label", "base_branch=main",
         "--timeout", "3600"], capture_output=True, text=True, cwd=ROOT)
    t_exit = time.time()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        result = stages(client, branch, t0, t_exit)
    result["exit"] = done.returncode
    if done.returncode != 0:
        result["stderr"] = (done.stdout + done.stderr)[-1500:]
    return result


def print_one(index: int, result: dict[str, Any]) -> None:
    print(f"run {index}: exit {result['exit']}  total {result['total_s']} s  = upload {result['upload_s']} + "
          f"environment {result['environment_s']} + queue {result['queue_s']} + checks + verdict {result['verdict_s']}")
    for name, check in result["checks"].items():
        print(f"    {name:<26} start +{check['start_s']:>6} s  {check['seconds']:>6} s  {check['verdict']}")
    if "stderr" in result:
        print(result["stderr"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", choices=("main", "default"), default="main")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", help="the Python main's wheel is built with (default: the service's 3.12)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="parity-gate-"))
    (CACHE / "pythons").mkdir(parents=True, exist_ok=True)  # own_service links its builds' base here
    base = wheel("clean", args.python or interpreters.configured(None)["3.12"]) if args.build == "main" else None
    url, token, procs = own_service(work)
    try:
        if base is not None:  # the several-GB torch base is the machine's, not the PR's: before the clock
            subprocess.run([*PARITY, "pythons", "prepare", "3.12"], check=True, cwd=ROOT, capture_output=True)
        subprocess.run([*PARITY, "suite", "apply", str(ROOT / "suites" / "gate.yaml"), "--url", url,
                        "--token", token], check=True, cwd=ROOT, capture_output=True)
        load_before = os.getloadavg()
        results = []
        for index in range(1, args.repeat + 1):
            marker = uuid.uuid4().hex[:8]
            whl = marked_copy(base, work / marker, marker) if base is not None else None
            result = one_gate(url, token, whl, f"gate-{marker}", work)
            results.append(result)
            if not args.json:
                print_one(index, result)
        summary = {"build": args.build, "suite_warm": os.environ.get("PARITY_SUITE_WARM", "true"),
                   "median_total_s": statistics.median(r["total_s"] for r in results),
                   "load_before": [round(x, 1) for x in load_before],
                   "load_after": [round(x, 1) for x in os.getloadavg()], "cpus": os.cpu_count()}
        print(json.dumps({**summary, "runs": results}) if args.json else
              f"median upload -> verdict {summary['median_total_s']} s over {len(results)}; build {args.build}, "
              f"PARITY_SUITE_WARM={summary['suite_warm']}, load {summary['load_before']} -> {summary['load_after']} "
              f"on {summary['cpus']} CPUs")
        return 0 if all(r["exit"] == 0 for r in results) else 1
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
        stop_leftovers(work)  # the warm pool's workers: their scheduler is gone
        # the embedded Postgres outlives the service's processes: a fast shutdown, then its data, the builds
        # and the runs go (the service's logs stay in `work`)
        postmaster = work / "data" / "pgdata" / "postmaster.pid"
        if postmaster.exists():
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGINT)
            deadline = time.monotonic() + 60
            while postmaster.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(work / "data", ignore_errors=True)
        print(f"service logs: {work}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
