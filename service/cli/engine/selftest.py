"""`parity selftest`: inject the mutant catalogue into Megatron-Core and check the detector catches it."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `selftest` subcommand."""
    p = subparsers.add_parser(
        "selftest",
        help="run the mutation self-test (injected resume bugs must be caught, benign ones must pass)",
        description="Exit code: 0 when every mutant is caught and nothing benign is flagged, 1 otherwise.",
    )
    p.add_argument("--dp", type=int, action="append", default=None, help="data-parallel size (repeatable; default 2)")
    p.add_argument("--mutant", action="append", default=None, help="run only these mutants (repeatable)")
    p.add_argument("--base", action="append", default=None,
                   help="base spec the mutants run on (repeatable; default dense-bf16 and moe-fp32-router; "
                   "feature mutants always run on their own)")
    p.add_argument("--fast", action="store_true", help="smoke test: one run with several mutants, plus controls")
    p.add_argument("--run-folder", type=Path, default=None, help="where runs go (default: temp)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the self-test; print the detection matrix; 0 when 100 % caught and no false alarm."""
    from jobs.launch.selftest import format_matrix, run_selftest
    from jobs.selftest.catalogue import BASES, MATRIX_BASES, mutant_names

    bad = sorted(set(getattr(args, "base", None) or []) - set(BASES))
    if bad:
        print(f"parity selftest: base: unknown {', '.join(bad)}; allowed: {', '.join(BASES)}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.mutant or []) - set(mutant_names()))
    if unknown:
        print(f"parity selftest: mutant: unknown {', '.join(unknown)}; allowed: {', '.join(mutant_names())}",
              file=sys.stderr)
        return 2
    folder = args.run_folder or Path(tempfile.mkdtemp(prefix="parity-selftest-"))
    print(f"parity selftest: run folder {folder}", file=sys.stderr)
    bases = tuple(getattr(args, "base", None) or MATRIX_BASES)
    report = run_selftest(folder, tuple(args.dp or [2]), args.mutant, args.fast, bases=bases)
    print(json.dumps(report, default=str) if args.json else format_matrix(report))
    return 0 if report["ok"] else 1
