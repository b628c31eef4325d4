"""The prepared GPU run (issue 42): the gate's checks that fit the GPUs present, the GPU-able mutant slice, and
repeated clean runs for the noise, every check with `device: cuda`; one table of verdicts, deltas and seconds.

From a bare Python with torch (CUDA build) on a GPU host, no network:

    python benchmarks/gpu_gate.py --wheel megatron_core-*.whl [--wheelhouse DIR] [--out results/gpu]

It installs what the job side needs and this Python lacks (the megatron-core wheel it is given; submitit,
cloudpickle, PyYAML from --wheelhouse) with `pip --no-index` into OUT/site, puts this checkout's `jobs/`
on PYTHONPATH and re-runs itself there. Sized for < 8 minutes on one GPU (--budget-s, default 420: a
run that would start past it is listed as skipped). Without a GPU it says so and exits 3;
`--device cpu` runs the same plan on the CPU (a dry run of the script; --quick trims it to one run of
each kind). Exit 0 when every clean check passes and every mutant is caught, else 1.

`--write-calibration` stores the noise runs' bound in jobs/calibration/gpu.json (jobs/tolerance.py keeps
GPU bounds apart from the CPU's), for the `default` tolerance of that config, layout and device.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# what the job side imports beyond torch: import name -> the distribution pip installs
NEEDED = {"megatron.core": "megatron-core", "submitit": "submitit", "cloudpickle": "cloudpickle", "yaml": "pyyaml"}
# the catalogue's mutants that need nothing a GPU lacks (dense-bf16 base; each a restore bug a GPU resume can hide)
GPU_MUTANTS = ("model-weight-skipped", "main-params-from-model", "exp-avg-sq-reset", "exp-avg-sq-lossy-on-load",
               "adam-step-saved-off-by-one", "scheduler-one-step-behind", "rng-tracker-not-restored")
# judged under `default` too: the GPU noise bound must stay tight enough that these still fail
UNDER_DEFAULT = ("exp-avg-sq-lossy-on-load", "main-params-from-model")
TE_CHECKS = ({"config": "dense-fp8-te", "dp": 1, "steps": 6, "save_step": 3, "workarounds": ["restore-adam-step"]},
             {"config": "moe-grouped-gemm-te", "dp": 1, "steps": 6, "save_step": 3,
              "workarounds": ["restore-adam-step"]})
NOISE = {"config": "dense-bf16", "dp": 1, "steps": 10, "save_step": 5, "workarounds": ["restore-adam-step"]}


def log(text: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    print(f"gpu_gate: {text}", file=sys.stderr, flush=True)


def gpu_count() -> tuple[int, str]:
    """(GPUs this host has, their name), asked without initialising CUDA in this process (NVML)."""
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    driver = Path("/proc/driver/nvidia/gpus")
    listed = sum(1 for p in driver.iterdir() if p.is_dir()) if driver.is_dir() else 0
    try:
        import torch

        built = torch.version.cuda is not None
        count = torch.cuda.device_count() if built else 0
    except Exception as exc:  # noqa: BLE001 - a torch that cannot ask has no GPU for us
        return 0, f"torch cannot ask: {exc}"
    if not built:
        return 0, f"this torch ({torch.__version__}) is a CPU build; the driver lists {listed} GPU(s)"
    name = ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        name = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    return count, name or f"{count} CUDA device(s)"


def install(out: Path, wheel: Path | None, wheelhouse: Path | None) -> Path | None:
    """Install what is missing into out/site (pip --no-index); the folder to put on PYTHONPATH, or None."""
    missing = [dist for mod, dist in NEEDED.items() if importlib.util.find_spec(mod.split(".")[0]) is None
               or (mod == "megatron.core" and wheel is not None)]
    if not missing:
        return None
    site = out / "site"
    args = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
    if wheelhouse is not None:
        args += ["--find-links", str(wheelhouse)]
    names = [d for d in missing if d != "megatron-core"]
    if "megatron-core" in missing:
        if wheel is None:
            raise SystemExit("gpu_gate: megatron-core is not importable: give its wheel with --wheel")
        names.append(str(wheel))
    if any(n for n in names if not n.endswith(".whl")) and wheelhouse is None:
        raise SystemExit(f"gpu_gate: this Python lacks {', '.join(n for n in names if not n.endswith('.whl'))}: "
                         "give a folder of their wheels with --wheelhouse (no network is used)")
    log(f"installing {', '.join(names)} into {site}")
    subprocess.run([*args, *names], check=True)
    return site


def plan(gpus: int, device: str, quick: bool) -> list[dict[str, Any]]:
    """Every run: (name, kind, spec, mutant); the gate's checks that fit, the mutant slice, the noise repeats."""
    import yaml

    from jobs.selftest.catalogue import BASES, MUTANTS
    from jobs.spec import RunSpec

    runs: list[dict[str, Any]] = []
    gate = yaml.safe_load((ROOT / "suites" / "gate.yaml").read_text())
    for check in gate["checks"]:
        spec = {**check["spec"], "device": device}
        if device == "cuda" and RunSpec.from_dict(spec).world_size > gpus:
            runs.append({"name": check["name"], "kind": "gate", "spec": spec, "skip": f"needs more than {gpus} GPU(s)"})
            continue
        runs.append({"name": check["name"], "kind": "gate", "spec": spec})
    runs.append({"name": "control-dense-bf16", "kind": "control", "spec": {**BASES["dense-bf16"], "dp": 1,
                                                                            "device": device}})
    for name in GPU_MUTANTS:
        mutant = MUTANTS[name]
        spec = {**mutant.run_spec(1, "dense-bf16"), "device": device}
        runs.append({"name": name, "kind": "mutant", "spec": spec, "mutant": name})
        if name in UNDER_DEFAULT:
            runs.append({"name": f"{name}@default", "kind": "mutant", "spec": {**spec, "tolerance": "default"},
                         "mutant": name})
    have_te = importlib.util.find_spec("transformer_engine") is not None
    for spec in TE_CHECKS:
        te = {**spec, "device": "cuda"}
        if device != "cuda":
            runs.append({"name": spec["config"], "kind": "te", "spec": te, "skip": "a GPU check (device cuda only)"})
        else:
            runs.append({"name": spec["config"], "kind": "te", "spec": te,
                         "expect_unsupported": not have_te})  # without TE: unsupported-by-build, named
    for seed in (1, 2, 3):
        runs.append({"name": f"noise-seed{seed}", "kind": "noise", "spec": {**NOISE, "seed": seed, "device": device}})
    if quick:  # one of each kind
        kept, seen = [], set()
        for r in runs:
            if "skip" in r or r["kind"] not in seen:
                kept.append(r)
                seen.add(r["kind"])
        runs = kept
    return runs


def _max_rel(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = []
    for r in rows:
        a, b = r.get(f"{key}_baseline"), r.get(f"{key}_resumed")
        if a is not None and b is not None:
            vals.append(0.0 if a == b else abs(b - a) / abs(a) if a else float("inf"))
    return max(vals, default=None)


def run_all(runs: list[dict[str, Any]], out: Path, budget_s: float) -> list[dict[str, Any]]:
    """Run the plan through run-local's path (jobs.launch.local.run_parity); one row per run."""
    from jobs.launch.calibrate import NotClean, measure
    from jobs.launch.local import run_parity
    from jobs.selftest.catalogue import MUTANTS, judge
    from jobs.spec import RunSpec
    from jobs.verdict_names import PASS

    rows = []
    t_start = time.perf_counter()
    for i, run in enumerate(runs):
        row: dict[str, Any] = {"name": run["name"], "kind": run["kind"]}
        if "skip" in run:
            rows.append({**row, "outcome": "skipped", "detail": run["skip"]})
            continue
        if time.perf_counter() - t_start > budget_s:
            rows.append({**row, "outcome": "skipped", "detail": f"past the {budget_s:.0f} s budget"})
            continue
        t0 = time.perf_counter()
        try:
            result: dict[str, Any] = dict(run_parity(RunSpec.from_dict(run["spec"]), out / "runs" / f"{i:02d}"))
        except Exception as exc:  # noqa: BLE001 - one broken run is a row, not the end of the table
            rows.append({**row, "outcome": "crashed", "ok": False, "detail": f"{type(exc).__name__}: {exc}"[:300],
                         "seconds": round(time.perf_counter() - t0, 1)})
            continue
        steps = [s for s in result.get("steps") or [] if s.get("resumed_phase")]
        sigs = list(result.get("signatures") or [])
        row.update(verdict=result.get("verdict"), signatures=sigs, seconds=round(time.perf_counter() - t0, 1),
                   loss_rel=_max_rel(steps, "loss"), grad_norm_rel=_max_rel(steps, "grad_norm"),
                   device=((result.get("phases") or {}).get("resume") or {}).get("info", {}).get("device"),
                   error=((result.get("error") or {}).get("message") or "")[:300])
        if run["kind"] == "mutant":
            judged = judge(MUTANTS[run["mutant"]], result)
            row.update(ok=judged["ok"], outcome=judged["outcome"])
        elif run.get("expect_unsupported"):
            row.update(ok=sigs == ["unsupported-by-build"], outcome="unsupported-by-build (no TE)")
        else:
            row.update(ok=result.get("verdict") == PASS, outcome="pass" if result.get("verdict") == PASS else "FAIL")
        if run["kind"] == "noise":
            try:
                row["observed"] = measure(result)  # type: ignore[arg-type]
                row["ok"] = True  # drift is what a noise run measures; anything else is NotClean
                row["outcome"] = "bit-exact" if result.get("verdict") == PASS else "drift measured"
            except NotClean as exc:
                row.update(ok=False, outcome="not clean", detail=str(exc)[:300])
        log(f"{run['name']}: {row.get('outcome')} ({row['seconds']} s)")
        rows.append(row)
    return rows


def noise_entry(rows: list[dict[str, Any]], device_name: str, device: str) -> tuple[str, dict[str, Any]] | None:
    """The calibration entry of the noise runs (jobs/calibration/gpu.json), when every one measured."""
    from jobs.launch.calibrate import combine
    from jobs.tolerance import CALIBRATION_FACTOR, bounds_from, noise_key

    measured = [r["observed"] for r in rows if r["kind"] == "noise" and "observed" in r]
    if not measured or len(measured) != sum(1 for r in rows if r["kind"] == "noise" and r.get("outcome") != "skipped"):
        return None
    observed = combine(measured)
    entry = {"spec": {k: v for k, v in NOISE.items()}, "runs": len(measured), "factor": CALIBRATION_FACTOR,
             "build": {"device_name": device_name}, "observed": observed,
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "bound": bounds_from(observed, CALIBRATION_FACTOR)}
    resumed = int(str(NOISE["steps"])) - int(str(NOISE["save_step"]))
    return noise_key(str(NOISE["config"]), int(str(NOISE["dp"])), resumed, device), entry


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table docs/measurements.md keeps."""
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:.2g}" if isinstance(x, float) else str(x)

    def outcome(r: dict[str, Any]) -> str:
        return f"{r.get('outcome')} ({r['detail']})" if r.get("detail") else str(r.get("outcome"))

    lines = ["| run | kind | device | verdict | signatures | outcome | max loss rel | max grad-norm rel | s | ok |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['kind']} | {f(r.get('device'))} | {f(r.get('verdict'))} | "
                     f"{', '.join(r.get('signatures') or []) or '-'} | {outcome(r)} | {f(r.get('loss_rel'))} | "
                     f"{f(r.get('grad_norm_rel'))} | {f(r.get('seconds'))} | "
                     f"{'-' if 'ok' not in r else 'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Install, plan, run, print; the exit code says whether the GPU gate held."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--wheel", type=Path, help="the megatron-core wheel to test (installed with pip --no-index)")
    p.add_argument("--wheelhouse", type=Path, help="wheels of submitit, cloudpickle, PyYAML if this Python lacks them")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of the script")
    p.add_argument("--out", type=Path, default=Path("results/gpu_gate"))
    p.add_argument("--budget-s", type=float, default=420.0, help="no run starts after this many seconds")
    p.add_argument("--quick", action="store_true", help="one run of each kind")
    p.add_argument("--write-calibration", action="store_true",
                   help="store the noise bound in jobs/calibration/gpu.json")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpus, name = gpu_count()
    log(f"python {sys.version.split()[0]}; GPUs: {gpus} ({name})")
    if args.device == "cuda" and gpus < 1:
        print(f"gpu_gate: no GPU is present ({name}): nothing was run. Run it on a GPU host, or pass --device cpu "
              "for a dry run of the script on the CPU.", file=sys.stderr)
        return 3
    if os.environ.get("GPU_GATE_INSTALLED") != "1":
        site = install(args.out, args.wheel, args.wheelhouse)
        env = dict(os.environ, GPU_GATE_INSTALLED="1", PYTORCH_NVML_BASED_CUDA_CHECK="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(site) if site else "", str(ROOT),
                                                             os.environ.get("PYTHONPATH", "")])))
        # a fresh interpreter sees the installed packages; the job processes inherit PYTHONPATH
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]] if argv is None
                              else [sys.executable, str(Path(__file__).resolve()), *argv], env=env).returncode
    sys.path.insert(0, str(ROOT))
    import megatron.core
    import torch

    log(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, device {args.device}")
    runs = plan(gpus, args.device, args.quick)
    t0 = time.perf_counter()
    rows = run_all(runs, args.out, args.budget_s)
    total = round(time.perf_counter() - t0, 1)
    found = noise_entry(rows, name if args.device == "cuda" else "cpu", args.device)
    report = {"device": args.device, "gpus": gpus, "device_name": name, "torch": torch.__version__,
              "megatron_core": megatron.core.__version__, "seconds": total, "rows": rows,
              "noise_entry": dict([found]) if found else None}
    (args.out / "gpu_gate.json").write_text(json.dumps(report, indent=1, default=str))
    print(table(rows))
    print(f"\n{len(rows)} runs in {total} s on {args.device} ({name}); report: {args.out / 'gpu_gate.json'}")
    if found and args.write_calibration and args.device == "cuda":
        from jobs.tolerance import GPU_CALIBRATION_FILE, load_calibration

        data = load_calibration(GPU_CALIBRATION_FILE)
        data["entries"][found[0]] = found[1]
        GPU_CALIBRATION_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {found[0]} to {GPU_CALIBRATION_FILE}")
    ran = [r for r in rows if r.get("outcome") != "skipped"]
    return 0 if ran and all(r.get("ok") for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
