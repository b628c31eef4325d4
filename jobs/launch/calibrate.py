"""Measure what a clean run's deltas are, so that tolerance bounds are numbers someone observed.

`calibrate_reshard`: clean resumes at another DP size (one per seed) give the largest loss, grad
norm, num-zeros, lr and final-state deltas of a config and direction; the entry written to
`jobs/calibration/reshard.json` keeps them with the build that produced them, and the bounds
(`tolerance.bounds_from`: a small factor above them) that the verdict then judges such resumes by.
`calibrate_noise`: the same measurement for a run at one DP size (run-to-run noise of a check on
this hardware) and the tightest named profile that covers it. Run as `parity calibrate`, or
`python -m jobs.launch.calibrate`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.contract import STATE_FINAL, ParityResult
from jobs.launch.local import run_parity
from jobs.signature_names import FINAL_STATE_MISMATCH, LOSS_DIVERGENCE_UNEXPLAINED
from jobs.spec import RunSpec, SpecError
from jobs.tolerance import (
    CALIBRATION_FACTOR,
    CALIBRATION_FILE,
    NUMERIC_STATE_SECTIONS,
    TOLERANCE_PROFILES,
    bounds_from,
    load_calibration,
    reshard_key,
)
from jobs.verdict.state_diff import snapshot_diffs

DEFAULT_SEEDS = (1234, 1235, 1236)
# the workarounds of the known upstream bugs a clean run on 0.16.x needs (each says when it was not needed)
DEFAULT_WORKAROUNDS = ("match-groups-by-lr-bounds", "realign-param-index", "restore-adam-step")
# what a clean run may show: its drift (judged by the bound being measured), and not being judged yet
DRIFT_SIGNATURES = {FINAL_STATE_MISMATCH, LOSS_DIVERGENCE_UNEXPLAINED}
Runner = Callable[[RunSpec, Path], ParityResult]


class NotClean(RuntimeError):
    """A calibration run showed something besides numerical drift: its deltas bound nothing."""


def _rel(a: Any, b: Any) -> float:
    if a is None or b is None or a == b:
        return 0.0
    return abs(b - a) / abs(a) if a else math.inf


def measure(result: ParityResult) -> dict[str, Any]:
    """The largest deltas of one clean run: per-step lanes over the resumed steps, and the final state."""
    problems = [e["message"] for e in result["errors"] if e["type"] != "NotCalibrated"]
    problems += [s for s in result["signatures"] if s not in DRIFT_SIGNATURES]
    if problems:
        raise NotClean(f"not a clean run ({result['verdict']}): {'; '.join(problems)}")
    rows = [r for r in result["steps"] if r["resumed_phase"]]
    probes: dict[str, Any] = dict(result["probes"])
    base, res = (dict(probes.get(p) or {}) for p in ("train_and_save", "resume"))
    discrete = {
        s: len(d) for s, d in snapshot_diffs(base.get(STATE_FINAL), res.get(STATE_FINAL)).items()
        if s not in NUMERIC_STATE_SECTIONS
    }
    if discrete:
        raise NotClean(f"the final states differ in discrete sections {discrete}: not drift")
    deltas = res.get("state_final_deltas") or {}
    sections = None if "error" in deltas else deltas.get("sections")
    if not sections:
        raise NotClean("the resume measured no final-state deltas (state_final_deltas)")
    return {
        "loss_rel": max((_rel(r["loss_baseline"], r["loss_resumed"]) for r in rows), default=0.0),
        "grad_norm_rel": max((_rel(r["grad_norm_baseline"], r["grad_norm_resumed"]) for r in rows), default=0.0),
        "num_zeros_rel": max((_rel(r["num_zeros_baseline"], r["num_zeros_resumed"]) for r in rows), default=0.0),
        "lr_abs": max((abs((r["lr_resumed"] or 0) - (r["lr_baseline"] or 0)) for r in rows), default=0.0),
        "state": {s: float(sections[s]["max_rel"]) for s in NUMERIC_STATE_SECTIONS},
        "state_worst": {s: sections[s]["worst"] for s in NUMERIC_STATE_SECTIONS},
        "first_resumed_loss_exact": bool(rows) and rows[0]["loss_baseline"] == rows[0]["loss_resumed"],
    }


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest of each delta over several runs."""
    keys = ("loss_rel", "grad_norm_rel", "num_zeros_rel", "lr_abs")
    return {
        **{k: max(r[k] for r in runs) for k in keys},
        "state": {s: max(r["state"][s] for r in runs) for s in NUMERIC_STATE_SECTIONS},
    }


def _runs(specs: list[RunSpec], folder: Path, runner: Runner, log: Callable[[str], None]) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        t0 = time.perf_counter()
        result = runner(spec, folder / f"seed{spec.seed}")
        m = measure(result)
        m["seconds"] = round(time.perf_counter() - t0, 1)
        resumed = result["phases"]["resume"]
        info: dict[str, Any] = dict(resumed["info"]) if resumed else {}
        m["build"] = {k: info.get(k) for k in ("megatron_core", "torch")}
        log(f"seed {spec.seed}: loss {m['loss_rel']:.3g}, grad norm {m['grad_norm_rel']:.3g}, "
            f"state {json.dumps({s: float(f'{v:.3g}') for s, v in m['state'].items()})} ({m['seconds']} s)")
        out.append(m)
    return out


def calibrate_reshard(
    config: str, dp: int, resume_dp: int | None, steps: int, save_step: int, *, seeds: tuple[int, ...] = DEFAULT_SEEDS,
    workarounds: tuple[str, ...] = DEFAULT_WORKAROUNDS, folder: Path, factor: float = CALIBRATION_FACTOR,
    runner: Runner = run_parity, log: Callable[[str], None] = print, layout: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Run clean reshard resumes, one per seed; return (key, the calibration entry).

    `layout` adds the save's and the resume's model-parallel sizes and the sharding (tp, resume_tp, …) for a
    resume on another layout."""
    base = {"config": config, "dp": dp, "steps": steps, "save_step": save_step, "workarounds": list(workarounds),
            **({"resume_dp": resume_dp} if resume_dp is not None else {}), **(layout or {})}
    specs = [RunSpec.from_dict({**base, "seed": s}) for s in seeds]
    runs = _runs(specs, folder, runner, log)
    observed = combine(runs)
    entry = {
        "spec": base,
        "training": specs[0].training,  # a bound holds for the training it was measured on (jobs/tolerance.py)
        "seeds": list(seeds),
        "runs": len(runs),
        "build": runs[0]["build"],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "observed": observed,
        "per_run": [{k: r[k] for k in ("loss_rel", "grad_norm_rel", "state", "state_worst", "seconds",
                                       "first_resumed_loss_exact")} for r in runs],
        "factor": factor,
        "bound": bounds_from(observed, factor),
    }
    spec = specs[0]
    return reshard_key(config, dp, spec.phase_dp("resume"), steps - save_step,
                       change=spec.layout_change if spec.layout_free_view else None), entry


def write_entry(key: str, entry: dict[str, Any], path: Path = CALIBRATION_FILE) -> None:
    """Add or replace one entry of the calibration file (sorted keys, one diffable document)."""
    data = load_calibration(path)
    data.setdefault("entries", {})[key] = entry
    data["about"] = ("Largest deltas of clean resumes at another DP size, per config and direction, and the "
                     "bounds the verdict judges such resumes by (parity calibrate; jobs/tolerance.py).")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def propose(observed: dict[str, Any]) -> str | None:
    """The tightest named profile whose every bound covers the observed deltas (None: none does)."""
    for name in ("exact", "default", "loose"):
        p = TOLERANCE_PROFILES[name]
        if (observed["loss_rel"] <= p.loss_rtol and observed["lr_abs"] <= p.lr_atol + p.lr_rtol
                and max(observed["grad_norm_rel"], observed["num_zeros_rel"]) <= p.metrics_bound()
                and all(observed["state"][s] <= p.state_bound(s) for s in NUMERIC_STATE_SECTIONS)):
            return name
    return None


def calibrate_noise(
    spec: dict[str, Any], *, seeds: tuple[int, ...] = DEFAULT_SEEDS, folder: Path,
    runner: Runner = run_parity, log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run-to-run noise of a check at one DP size on this hardware, and the profile that covers it."""
    # judged loosely so that noise is measured, not refused; the measurement is what counts
    runs = _runs([RunSpec.from_dict({**spec, "seed": s, "tolerance": "loose"}) for s in seeds], folder, runner, log)
    observed = combine(runs)
    return {"spec": spec, "seeds": list(seeds), "build": runs[0]["build"], "observed": observed,
            "proposed_profile": propose(observed)}


def main(argv: list[str] | None = None) -> int:
    """`python -m jobs.launch.calibrate`: the same as `parity calibrate`."""
    p = argparse.ArgumentParser(prog="python -m jobs.launch.calibrate", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The calibration options (shared with `parity calibrate`)."""
    p.add_argument("--config", required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--resume-dp", type=int, default=None, help="calibrate the reshard bound of dp -> this DP size")
    for dim in ("tp", "pp", "ep"):
        p.add_argument(f"--{dim}", type=int, default=None, help=f"the save's {dim.upper()} size (default 1)")
        p.add_argument(f"--resume-{dim}", type=int, default=None,
                       help=f"calibrate a resume at this {dim.upper()} size (with --sharding fully_reshardable)")
    p.add_argument("--sharding", default=None, help="the optimizer's checkpoint format (a layout change: "
                   "fully_reshardable)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-step", type=int, default=3)
    p.add_argument("--seed", type=int, action="append", dest="seeds", help="repeatable (default 1234, 1235, 1236)")
    p.add_argument("--workaround", action="append", dest="workarounds",
                   help=f"repeatable (default {', '.join(DEFAULT_WORKAROUNDS)})")
    p.add_argument("--mutant", action="append", default=[], help="(noise only) measure with a benign mutant")
    p.add_argument("--factor", type=float, default=CALIBRATION_FACTOR)
    p.add_argument("--write", action="store_true", help=f"store the reshard entry in {CALIBRATION_FILE.name}")
    p.add_argument("--run-folder", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    """Calibrate a reshard bound (--resume-dp) or a check's run-to-run noise; print JSON; 0 on success, 1 when a
    run was not clean, 2 for an invalid spec."""
    folder = args.run_folder or Path(tempfile.mkdtemp(prefix="parity-calibrate-"))
    seeds = tuple(args.seeds or DEFAULT_SEEDS)
    workarounds = tuple(args.workarounds or DEFAULT_WORKAROUNDS)

    def log(line: str) -> None:
        print(f"calibrate: {line}", file=sys.stderr)

    try:
        layout = {k: getattr(args, k) for k in ("tp", "pp", "ep", "resume_tp", "resume_pp", "resume_ep", "sharding")
                  if getattr(args, k) is not None}
        if args.resume_dp is not None or any(k.startswith("resume_") for k in layout):
            key, entry = calibrate_reshard(
                args.config, args.dp, args.resume_dp, args.steps, args.save_step, seeds=seeds,
                workarounds=workarounds, folder=folder, factor=args.factor, log=log, layout=layout,
            )
            if args.write:
                write_entry(key, entry)
                log(f"wrote {key} to {CALIBRATION_FILE}")
            print(json.dumps({key: entry}, indent=1))
        else:
            spec = {"config": args.config, "dp": args.dp, "steps": args.steps, "save_step": args.save_step,
                    "workarounds": list(workarounds), **({"mutants": args.mutant} if args.mutant else {})}
            print(json.dumps(calibrate_noise(spec, seeds=seeds, folder=folder, log=log), indent=1))
    except NotClean as exc:
        log(str(exc))
        return 1
    except SpecError as exc:  # the field and its allowed values, as run-local says it; never a traceback
        print(f"parity calibrate: invalid spec: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
