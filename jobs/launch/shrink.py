"""Shrink a failing check to its smallest reproduction: the same verdict and signatures, a smaller spec.

Greedy, one change at a time, each tried with a real run: DP 1 (and no tp / pp / ep), fewer
layers and experts, a smaller hidden / FFN size, sequence and vocabulary, an earlier save, fewer
steps. A change is kept when the run ends in the same verdict with the same signatures; the search
repeats until no change is kept or the run budget is spent. The result names the smallest spec,
its `parity run-local` command, and every step tried (`parity shrink`).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jobs.configs import CONFIGS
from jobs.contract import ParityResult
from jobs.launch.local import run_parity
from jobs.shape import apply_shape, estimated_params, preset_value
from jobs.spec import RunSpec, SpecError

Runner = Callable[[RunSpec, Path], ParityResult]
MAX_RUNS = 16


def outcome(result: ParityResult | dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """What must stay the same: the verdict and the set of signatures."""
    return str(result["verdict"]), tuple(sorted(result.get("signatures") or []))


def size(spec: RunSpec) -> tuple[int, int, int, int, int]:
    """How big a spec is, compared lexicographically: ranks, parameters, steps, the save step, tokens per sample."""
    cfg = apply_shape(CONFIGS[spec.config], spec.shape)
    gpt = cfg.kind == "gpt"
    return (spec.world_size + (spec.phase_world_size("resume") if spec.reshards else 0),
            estimated_params(cfg) if gpt else 0, spec.steps,
            spec.save_step, cfg.seq_length if gpt else 0)


def _shape_value(spec: RunSpec, name: str) -> Any:
    return spec.shape.get(name, preset_value(apply_shape(CONFIGS[spec.config], {}), name))


def candidates(spec: RunSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """Smaller specs one change away, most promising first: (what changed, the spec as data)."""
    base = spec.to_dict()
    if spec.dp > 1 and not spec.reshards:
        yield "dp 1", {**base, "dp": 1, "nodes": 1, "ep": 1}
    for name in ("tp", "pp", "ep"):
        if getattr(spec, name) > 1:
            yield f"{name} 1", {**base, name: 1}
    cfg = CONFIGS[spec.config]
    shape = dict(spec.shape)
    if cfg.kind == "gpt":
        for name, smallest in (("num_layers", 1), ("num_experts", 2)):
            if name == "num_experts" and not cfg.num_experts:
                continue
            if _shape_value(spec, name) > smallest:
                extra = {"moe_router_topk": min(_shape_value(spec, "moe_router_topk"), smallest)} \
                    if name == "num_experts" else {}
                yield f"{name} {smallest}", {**base, "shape": {**shape, name: smallest, **extra}}
    # an earlier save keeps the number of resumed steps; then fewer resumed steps (one, else one fewer)
    if spec.save_step > 1:
        yield "save_step 1", {**base, "save_step": 1, "steps": spec.steps - spec.save_step + 1}
    if spec.steps > spec.save_step + 1:
        yield f"steps {spec.save_step + 1}", {**base, "steps": spec.save_step + 1}
    if spec.steps > spec.save_step + 2:
        yield f"steps {spec.steps - 1}", {**base, "steps": spec.steps - 1}
    if cfg.kind == "gpt":
        for name, floor in (("hidden_size", 32), ("ffn_hidden_size", 32), ("seq_length", 8), ("vocab_size", 128)):
            now = _shape_value(spec, name)
            if now // 2 >= floor:
                extra = {"ffn_hidden_size": _shape_value(spec, "ffn_hidden_size")} if name == "hidden_size" else {}
                yield f"{name} {now // 2}", {**base, "shape": {**shape, **extra, name: now // 2}}


def shrink(
    spec: RunSpec, target: tuple[str, tuple[str, ...]], folder: Path, *, runner: Runner = run_parity,
    max_runs: int = MAX_RUNS, log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Search smaller specs with the same outcome; return the smallest with its command and the trail."""
    best, runs = spec, 0
    trail: list[dict[str, Any]] = []
    improved = True
    while improved and runs < max_runs:
        improved = False
        for change, data in candidates(best):
            try:
                trial = RunSpec.from_dict(data)
            except SpecError as exc:  # a change this config does not allow (divisibility, warm-up, ...)
                trail.append({"change": change, "skipped": str(exc)})
                continue
            if size(trial) >= size(best):
                continue
            runs += 1
            t0 = time.perf_counter()
            got = outcome(runner(trial, folder / f"try-{runs:02d}"))
            kept = got == target
            trail.append({"change": change, "verdict": got[0], "signatures": list(got[1]), "kept": kept,
                          "seconds": round(time.perf_counter() - t0, 1)})
            log(f"try {runs}: {change}: {got[0]} {', '.join(got[1]) or '-'} -> {'kept' if kept else 'dropped'}")
            if kept:
                best, improved = trial, True
                break
            if runs >= max_runs:
                break
    return {
        "original": spec.to_dict(),
        "smallest": best.to_dict(),
        "strictly_smaller": size(best) < size(spec),
        "size": {"original": size(spec), "smallest": size(best)},
        "target": {"verdict": target[0], "signatures": list(target[1])},
        "runs": runs,
        "command": run_local_command(best),
        "trail": trail,
    }


def run_local_command(spec: RunSpec) -> str:
    """The `parity run-local` command that reproduces a spec (mutants have no flag: the self-test sets them)."""
    parts = ["parity", "run-local", "--config", spec.config, "--dp", str(spec.dp), "--steps", str(spec.steps),
             "--save-step", str(spec.save_step)]
    d = spec.to_dict()
    for key, flag in (("sharding", "--sharding"), ("seed", "--seed"), ("tolerance", "--tolerance"),
                      ("isolation", "--isolation")):
        default = getattr(RunSpec, key, None)
        if d.get(key) is not None and d[key] != default:
            parts += [flag, str(d[key])]
    for w in spec.workarounds:
        parts += ["--workaround", w]
    for name in ("tp", "pp", "ep"):
        if getattr(spec, name) > 1:
            parts += [f"--{name}", str(getattr(spec, name))]
    for name in ("resume_dp", "resume_tp", "resume_pp", "resume_ep"):
        if getattr(spec, name) is not None:
            parts += [f"--{name.replace('_', '-')}", str(getattr(spec, name))]
    for key, value in sorted(spec.shape.items()):
        parts += ["--shape", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return " ".join(shlex.quote(p) for p in parts)
