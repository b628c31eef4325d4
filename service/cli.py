"""The `parity` command line: one subcommand per module in service/commands."""

from __future__ import annotations

import argparse
import sys

from service.errors import ConfigError

# each module in service/commands registers one subcommand (imported lazily: torch is slow to import)
COMMANDS = (
    "serve", "scheduler", "db", "token", "submit", "env", "sweep", "bisect", "demo", "run_local", "configs", "notify",
    "selftest", "calibrate", "shrink",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    import importlib

    parser = argparse.ArgumentParser(prog="parity", description="Megatron-Core resume-parity service")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"service.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: run a subcommand; configuration errors are one line on stderr and exit code 2."""
    from service.commands.common import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"parity: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
