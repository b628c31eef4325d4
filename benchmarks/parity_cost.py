"""Cost of a full parity check vs one uninterrupted launch of the same M steps.

    python benchmarks/parity_cost.py [--config moe-fp32-router] [--dp 2] [--steps 20] [--save-step 10]
                                     [--repeat 3] [--json]

Both sides go through the same submitit local executor with tasks_per_node = dp. The baseline is
the `train` phase (steps 1..M, no checkpoint); the full check is `run_parity` (train_and_save,
then resume in fresh processes, then evaluate). Reports medians over --repeat runs after one
warm-up, a per-stage breakdown, and peak RSS per rank. Target: ratio <= 2.0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.contract import ParityResult
from jobs.launch.local import launch_phase, run_parity
from jobs.spec import RunSpec

WORKAROUNDS = ("realign-param-index", "restore-adam-step")


def _rank_docs(folder: Path, phase: str, dp: int) -> list[dict[str, Any]]:
    return [json.loads((folder / phase / f"result.rank{r}.json").read_text()) for r in range(dp)]


def _info(result: ParityResult, index: int) -> dict[str, Any]:
    summary = list(result["phases"].values())[index]
    return summary["info"] if summary else {}


def _breakdown(doc: dict[str, Any]) -> dict[str, Any]:
    info = doc.get("info", {})
    launch, inside = info.get("launch_wall_seconds"), info.get("wall_seconds")
    return {
        "launch_wall_s": launch,
        "in_process_s": inside,
        "outside_process_s": None if launch is None or inside is None else round(launch - inside, 3),
        "stages_s": doc.get("stage_seconds", {}),
        "save_s": info.get("save_seconds"),
        "load_s": info.get("load_seconds"),
    }


def measure(spec: RunSpec, root: Path, index: int) -> dict[str, Any]:
    """Run one uninterrupted launch and one full parity check; return their figures."""
    base_folder, full_folder = root / f"base{index}", root / f"full{index}"
    t0 = time.perf_counter()
    base = launch_phase(spec, base_folder, "uninterrupted")
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = run_parity(spec, full_folder)
    t_full = time.perf_counter() - t0
    if base["status"] != "ok" or result["verdict"] != "pass":
        raise SystemExit(f"benchmark run did not pass: base {base['status']}, full {result['verdict']}")
    peak = {
        "uninterrupted": [
            d["info"]["peak_memory"]["max_rss_bytes"] for d in _rank_docs(base_folder, "uninterrupted", spec.dp)
        ],
        "train_and_save": [
            d["info"]["peak_memory"]["max_rss_bytes"] for d in _rank_docs(full_folder, "train_and_save", spec.dp)
        ],
        "resume": [d["info"]["peak_memory"]["max_rss_bytes"] for d in _rank_docs(full_folder, "resume", spec.dp)],
    }
    return {
        "uninterrupted_s": round(t_base, 3),
        "full_check_s": round(t_full, 3),
        "ratio": round(t_full / t_base, 3),
        "breakdown": {
            "uninterrupted": _breakdown(dict(base)),
            "train_and_save": _breakdown(_rank_docs(full_folder, "train_and_save", 1)[0] | {"info": _info(result, 0)}),
            "resume": _breakdown(_rank_docs(full_folder, "resume", 1)[0] | {"info": _info(result, 1)}),
        },
        "peak_rss_bytes_per_rank": peak,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="moe-fp32-router")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-step", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    spec = RunSpec(config=args.config, dp=args.dp, steps=args.steps, save_step=args.save_step, workarounds=WORKAROUNDS)
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as tmp:
        root = Path(tmp)
        measure(spec, root, -1)  # warm-up: page cache, .pyc files
        runs = [measure(spec, root, i) for i in range(args.repeat)]
    summary = {
        "spec": spec.to_dict(),
        "uninterrupted_s_median": statistics.median(r["uninterrupted_s"] for r in runs),
        "full_check_s_median": statistics.median(r["full_check_s"] for r in runs),
        "ratio_median": statistics.median(r["ratio"] for r in runs),
        "runs": runs,
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
        return 0
    print(f"config {spec.config} dp={spec.dp} M={spec.steps} N={spec.save_step}, {args.repeat} runs after 1 warm-up")
    print(f"uninterrupted launch (M steps):  median {summary['uninterrupted_s_median']:.2f} s")
    print(f"full parity check (2 launches): median {summary['full_check_s_median']:.2f} s")
    print(f"ratio: median {summary['ratio_median']:.2f}  (runs: {', '.join(str(r['ratio']) for r in runs)})")
    last = runs[-1]
    for name, b in last["breakdown"].items():
        stages = ", ".join(f"{k} {v:.2f}" for k, v in b["stages_s"].items())
        print(
            f"  {name:15s} launch {b['launch_wall_s']:.2f} s = in-process {b['in_process_s']:.2f} "
            f"+ start/teardown {b['outside_process_s']:.2f}; stages: {stages}"
        )
    for name, values in last["peak_rss_bytes_per_rank"].items():
        print(f"  peak RSS {name:15s} " + ", ".join(f"rank{r} {v / 2**20:.0f} MiB" for r, v in enumerate(values)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
