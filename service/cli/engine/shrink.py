"""`parity shrink`: search smaller specs that fail the same way; record the smallest with its run-local command."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from jobs.verdict_names import FAIL, KNOWN_FAILURE, NOT_PASSED


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `shrink` subcommand."""
    p = subparsers.add_parser(
        "shrink",
        help="shrink a failing run to its smallest reproduction (same verdict and signatures)",
        description="Runs smaller specs locally, one change at a time (DP 1, fewer layers and experts, smaller "
        "hidden size, an earlier save, fewer steps), keeping a change when the verdict and signatures stay "
        "the same. With RUN, the run's spec and outcome come from the database and the smallest reproduction "
        "is stored on the run (the triage page's 'copy as issue' shows it). Exit code: 0 when a strictly "
        "smaller spec reproduces it, 1 when none does, 2 on bad input.",
    )
    p.add_argument("run", nargs="?", type=int, help="the run id (database)")
    p.add_argument("--spec", help="a spec as JSON instead of a run (its outcome is measured first)")
    p.add_argument("--max-runs", type=int, default=16, help="stop after this many trial runs")
    p.add_argument("--run-folder", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print the result as one JSON document")
    p.set_defaults(func=handle)


def _from_run(run_id: int) -> tuple[dict[str, Any], tuple[str, tuple[str, ...]]]:
    from models import Run
    from service.cli.common import ready_database
    from service.core.db import session_scope

    ready_database(migrate=False)
    with session_scope() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise SystemExit(f"parity shrink: run {run_id} does not exist")
        if run.verdict not in NOT_PASSED:
            raise SystemExit(f"parity shrink: run {run_id} did not fail (verdict {run.verdict}); nothing to shrink")
        verdict = FAIL if run.verdict == KNOWN_FAILURE else str(run.verdict)
        return dict(run.spec), (verdict, tuple(sorted(run.signatures or [])))


def _record(run_id: int, result: dict[str, Any]) -> None:
    from models import Run
    from service.core.db import session_scope

    with session_scope() as session:
        run = session.get(Run, run_id)
        if run is not None:
            run.summary = {**(run.summary or {}), "shrink": {k: v for k, v in result.items() if k != "trail"}}


def handle(args: argparse.Namespace) -> int:
    """Shrink, print the smallest spec and its command, store it on the run."""
    from jobs.launch.local import run_parity
    from jobs.launch.shrink import outcome, shrink
    from jobs.spec import RunSpec, SpecError

    if (args.run is None) == (args.spec is None):
        print("parity shrink: give a run id or --spec, not both", file=sys.stderr)
        return 2
    folder = args.run_folder or Path(tempfile.mkdtemp(prefix="parity-shrink-"))
    try:
        if args.run is not None:
            data, target = _from_run(args.run)
            spec = RunSpec.from_dict(data)
        else:
            spec = RunSpec.from_dict(json.loads(args.spec))
            target = outcome(run_parity(spec, folder / "original"))
    except (SpecError, json.JSONDecodeError) as exc:
        print(f"parity shrink: invalid spec: {exc}", file=sys.stderr)
        return 2
    if target[0] == "pass":
        print("parity shrink: the spec passes; nothing to shrink", file=sys.stderr)
        return 1
    result = shrink(spec, target, folder, runner=run_parity, max_runs=args.max_runs,
                    log=lambda line: print(f"parity shrink: {line}", file=sys.stderr))
    if args.run is not None:
        _record(args.run, result)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"smallest ({result['runs']} trial runs): {json.dumps(result['smallest'])}\n{result['command']}")
    return 0 if result["strictly_smaller"] else 1
