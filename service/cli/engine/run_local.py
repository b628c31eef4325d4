"""`parity run-local`: run one parity check on this machine (submitit local processes)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jobs.contract import Verdict

EXIT: dict[Verdict, int] = {"pass": 0, "fail": 1, "error": 2}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `run-local` subcommand."""
    from jobs.spec import (
        DEFAULT_ISOLATION,
        DEFAULT_NODES,
        DEFAULT_SHARDING,
        ISOLATION_MODES,
        SHARDING_TYPES,
        TOLERANCES,
        WORKAROUNDS,
    )
    from jobs.tolerance import DEFAULT_TOLERANCE

    p = subparsers.add_parser(
        "run-local",
        help="run one parity check locally (train+save, resume, compare)",
        description="Exit code: 0 pass, 1 fail, 2 error or invalid spec.",
    )
    p.add_argument("--config", required=True, help="named model config (see `parity configs`)")
    p.add_argument("--dp", type=int, required=True, help="data-parallel size (ranks)")
    p.add_argument("--steps", type=int, required=True, help="total steps M")
    p.add_argument("--save-step", type=int, required=True, help="checkpoint step N (1 <= N < M)")
    p.add_argument("--sharding", default=DEFAULT_SHARDING, help=f"one of {', '.join(SHARDING_TYPES)}")
    p.add_argument(
        "--workaround",
        action="append",
        default=[],
        dest="workarounds",
        help=f"opt-in workaround (repeatable): {', '.join(WORKAROUNDS)}",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tolerance", default=DEFAULT_TOLERANCE, help=f"one of {', '.join(TOLERANCES)}")
    p.add_argument(
        "--isolation",
        default=DEFAULT_ISOLATION,
        help=f"one of {', '.join(ISOLATION_MODES)}: fork a fresh child per phase in one job, or one job per phase",
    )
    # parallel layout: tp/pp/ep beside dp (ranks = dp * tp * pp)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size (MoE configs; must divide dp)")
    from service.cli.client.shape_arg import add_shape_argument

    add_shape_argument(p)
    p.add_argument("--resume-dp", type=int, default=None,
                   help="resume at this DP size instead of --dp (same global batch; its own job)")
    for dim in ("tp", "pp", "ep"):
        p.add_argument(f"--resume-{dim}", type=int, default=None,
                       help=f"resume at this {dim.upper()} size instead of --{dim} (--sharding fully_reshardable; "
                       "its own job)")
    p.add_argument("--nodes", type=int, default=DEFAULT_NODES,
                   help="Slurm nodes of the original run (recorded in the spec; locally every rank runs here)")
    p.add_argument("--mutant", action="append", default=[], dest="mutants",
                   help="inject a catalogued resume bug (the detector self-test; see `parity selftest`)")
    p.add_argument("--async-save", action="store_true",
                   help="save through Megatron's async path (training goes on while a forked writer writes)")
    p.add_argument("--fully-parallel", action="store_true",
                   help="save and load with Megatron's fully-parallel strategy wrappers over the DP group")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the ranks run: cpu (default) or cuda (one GPU of this host per rank, NCCL)")
    p.add_argument("--run-folder", type=Path, default=None,
                   help="where logs and checkpoints go (default: a temporary folder, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the temporary run folder (logs, checkpoints)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")
    build = p.add_mutually_exclusive_group()
    build.add_argument("--python", help="run the phases with this Python (e.g. a built environment's venv/bin/python)")
    build.add_argument("--environment",
                       help="run the phases with this service environment's Python (asked of PARITY_SERVICE_URL)")
    p.add_argument("--url", help="service URL for --environment (default PARITY_SERVICE_URL)")
    p.add_argument("--token", help="bearer token for --environment (default PARITY_TOKEN)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Validate the spec, run both phases, print the table or JSON; return 0/1/2."""
    from jobs.spec import RunSpec, SpecError
    from service.cli.client.shape_arg import parse_shape

    try:
        spec = RunSpec(**spec_values(args, parse_shape(args.shape)))
    except SpecError as exc:
        print(f"parity run-local: invalid spec: {exc}", file=sys.stderr)
        return 2
    if spec.device == "cuda":  # refused here as the service refuses it (422): before anything runs
        from service.executors.gpus import host_gpus, needed_per_node

        have, needed = host_gpus(), needed_per_node(spec)
        if have < needed:
            print(f"parity run-local: invalid spec: device: cuda needs {needed} GPU(s) (one per rank) and this "
                  f"host has {have}; allowed: cpu", file=sys.stderr)
            return 2
    python = args.python or (resolve_environment(args) if args.environment else None)
    from jobs.launch.local import format_step_table, run_parity

    folder = args.run_folder or Path(tempfile.mkdtemp(prefix="parity-run-"))
    print(f"parity run-local: run folder {folder}", file=sys.stderr)
    try:
        result = run_parity(spec, folder, executor=_executor_for(python) if python else None)
    finally:
        # a temporary folder holds a checkpoint per run: gone unless asked for; a named one is the user's
        if args.run_folder is None and not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            print(f"parity run-local: removed {folder} (--keep keeps it)", file=sys.stderr)
    if args.json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        print(format_step_table(result))
    return EXIT.get(result["verdict"], 2)


def spec_values(args: argparse.Namespace, shape: dict[str, Any]) -> dict[str, Any]:
    """RunSpec's fields from the options, one option per field (a field without one is a test failure)."""
    from dataclasses import fields

    from jobs.spec import RunSpec

    values = {f.name: getattr(args, f.name) for f in fields(RunSpec) if hasattr(args, f.name)}
    values["shape"] = shape
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def resolve_environment(args: argparse.Namespace) -> str:
    """The Python of the service environment named by --environment (GET /api/v1/environments/NAME)."""
    import httpx

    from service.cli.client.config import service_target

    url, token = service_target(args, "run-local")
    try:
        resp = httpx.get(f"{url}/api/v1/environments/{args.environment}", timeout=30,
                         headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx.HTTPError as exc:
        raise SystemExit(f"parity run-local: cannot ask {url} for environment {args.environment!r}: {exc}") from None
    if resp.status_code != 200:
        raise SystemExit(f"parity run-local: environment {args.environment!r}: {resp.status_code} {resp.text[:300]}")
    env = resp.json()
    if env.get("state", "ready") != "ready":
        raise SystemExit(f"parity run-local: environment {args.environment!r} is {env['state']}, not ready")
    print(f"parity run-local: environment {args.environment} -> {env['python']}", file=sys.stderr)
    return str(env["python"])


def _executor_for(python: str):  # type: ignore[no-untyped-def]
    """Local submitit processes under another Python, with this checkout's jobs package on its path."""
    import os
    import shlex

    import submitit

    repo = str(Path(__file__).resolve().parents[3])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH", "")]))
    return lambda folder: submitit.LocalExecutor(folder=str(folder), python=shlex.quote(python))
