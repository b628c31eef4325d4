"""Cost of a full parity check vs one uninterrupted launch of the same M steps, in both isolation modes.

    python benchmarks/parity_cost.py [--config moe-fp32-router] [--dp 2] [--steps 20] [--save-step 10]
                                     [--repeat 3] [--modes process,job] [--json]

Every side goes through the same submitit local executor with tasks_per_node = dp. The baseline is
the `train` phase (steps 1..M, no checkpoint, one job); the full check is `run_parity` (train_and_save,
then resume in fresh processes, then evaluate) under isolation "process" (one job whose tasks fork
a child per phase) and "job" (one job per phase). Each repeat runs the baseline and every mode
back to back, so load on a shared machine hits them alike; reports medians over --repeat after one
warm-up, a per-stage breakdown, and peak RSS per rank.
Targets: process <= 1.35x one uninterrupted launch; job <= 2.0x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from jobs.contract import ParityResult
from jobs.launch.local import launch_phase, run_parity
from jobs.run_folder import RunFolder
from jobs.spec import ISOLATION_MODES, RunSpec

WORKAROUNDS = ("realign-param-index", "restore-adam-step")


def _rank_docs(folder: Path, phase: str, dp: int) -> list[dict[str, Any]]:
    return [json.loads(RunFolder(folder).attempt(phase, 1).result(r).read_text()) for r in range(dp)]


def _info(result: ParityResult, index: int) -> dict[str, Any]:
    summary = list(result["phases"].values())[index]
    return summary["info"] if summary else {}


def _breakdown(doc: dict[str, Any]) -> dict[str, Any]:
    info = doc.get("info", {})
    launch = info.get("launch_wall_seconds", info.get("child_wall_seconds"))
    inside = info.get("wall_seconds")
    return {
        "launch_wall_s": launch,
        "in_process_s": inside,
        "outside_process_s": None if launch is None or inside is None else round(launch - inside, 3),
        "stages_s": doc.get("stage_seconds", {}),
        "save_s": info.get("save_seconds"),
        "load_s": info.get("load_seconds"),
    }


def _full(spec: RunSpec, folder: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = run_parity(spec, folder)
    seconds = time.perf_counter() - t0
    if result["verdict"] != "pass":
        raise SystemExit(f"benchmark run did not pass ({spec.isolation}): {result['verdict']} {result['errors']}")
    ranks = {p: _rank_docs(folder, p, spec.dp) for p in ("train_and_save", "resume")}
    return {
        "seconds": round(seconds, 3),
        "breakdown": {p: _breakdown(docs[0] | {"info": _info(result, i)}) for i, (p, docs) in enumerate(ranks.items())},
        "peak_rss": {p: [d["info"]["peak_memory"]["max_rss_bytes"] for d in docs] for p, docs in ranks.items()},
    }


def measure(spec: RunSpec, root: Path, index: int, modes: list[str]) -> dict[str, Any]:
    """Run one uninterrupted launch and one full parity check per isolation mode; return their figures."""
    base_folder = root / f"base{index}"
    t0 = time.perf_counter()
    base = launch_phase(spec, base_folder, "uninterrupted")
    t_base = time.perf_counter() - t0
    if base["status"] != "ok":
        raise SystemExit(f"uninterrupted launch failed: {base.get('error')}")
    out: dict[str, Any] = {
        "uninterrupted_s": round(t_base, 3),
        "uninterrupted": {
            "breakdown": _breakdown(dict(base)),
            "peak_rss": [
                d["info"]["peak_memory"]["max_rss_bytes"] for d in _rank_docs(base_folder, "uninterrupted", spec.dp)
            ],
        },
    }
    for mode in modes:
        full = _full(replace(spec, isolation=mode), root / f"{mode}{index}")
        out[mode] = full | {"ratio": round(full["seconds"] / t_base, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="moe-fp32-router")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-step", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--modes", default=",".join(ISOLATION_MODES), help="isolation modes to measure")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(ISOLATION_MODES))
    if unknown:
        raise SystemExit(f"--modes: unknown {', '.join(unknown)}; allowed: {', '.join(ISOLATION_MODES)}")
    spec = RunSpec(config=args.config, dp=args.dp, steps=args.steps, save_step=args.save_step, workarounds=WORKAROUNDS)
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as tmp:
        root = Path(tmp)
        measure(spec, root, -1, modes)  # warm-up: page cache, .pyc files
        runs = [measure(spec, root, i, modes) for i in range(args.repeat)]
    summary: dict[str, Any] = {
        "spec": spec.to_dict(),
        "uninterrupted_s_median": statistics.median(r["uninterrupted_s"] for r in runs),
        "modes": {
            m: {
                "full_check_s_median": statistics.median(r[m]["seconds"] for r in runs),
                "ratio_median": statistics.median(r[m]["ratio"] for r in runs),
                "ratios": [r[m]["ratio"] for r in runs],
            }
            for m in modes
        },
        "runs": runs,
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
        return 0
    print(f"config {spec.config} dp={spec.dp} M={spec.steps} N={spec.save_step}, {args.repeat} runs after 1 warm-up")
    print(f"uninterrupted launch (M steps, one job): median {summary['uninterrupted_s_median']:.2f} s")
    for m, figures in summary["modes"].items():
        print(f"full check, isolation {m:8s} median {figures['full_check_s_median']:.2f} s  "
              f"ratio median {figures['ratio_median']:.2f}  (runs: {', '.join(str(x) for x in figures['ratios'])})")
    last = runs[-1]
    rows = [("uninterrupted", last["uninterrupted"]["breakdown"], last["uninterrupted"]["peak_rss"])]
    for m in modes:
        rows += [(f"{m}/{p}", last[m]["breakdown"][p], last[m]["peak_rss"][p]) for p in ("train_and_save", "resume")]
    for name, b, rss in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in b["stages_s"].items())
        print(
            f"  {name:22s} launch {b['launch_wall_s']:.2f} s = in-process {b['in_process_s']:.2f} "
            f"+ start/teardown {b['outside_process_s']:.2f}; stages: {stages}; "
            f"peak RSS {', '.join(f'{v / 2**20:.0f}' for v in rss)} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
