"""`parity calibrate`: measure clean runs' deltas; store a reshard bound or propose a tolerance profile."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `calibrate` subcommand."""
    from jobs.launch.calibrate import add_arguments

    p = subparsers.add_parser(
        "calibrate",
        help="measure clean runs: a reshard bound per config and direction (--resume-dp), or run-to-run noise",
        description="With --resume-dp: clean resumes at another DP size, one per seed; their largest loss, "
        "grad norm and final-state deltas and the bounds a small factor above them (--write stores them in "
        "jobs/calibration/reshard.json, which the verdict reads). Without: the run-to-run noise of the check "
        "on this machine and the tightest tolerance profile that covers it. Exit code: 0, or 1 when a run "
        "was not clean.",
    )
    add_arguments(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the calibration."""
    from jobs.launch.calibrate import run

    return run(args)
