"""The `parity` command line: one subcommand per module in service/cli/{client,server,engine}."""

from __future__ import annotations

import argparse
import sys

from service.core.errors import ConfigError

# Each module registers one subcommand (imported lazily: torch is slow to import). client/ speaks HTTP
# to a service; server/ runs the service or touches its database; engine/ runs Megatron-Core here.
COMMANDS = (
    "server.serve", "server.scheduler", "server.db", "server.token", "client.submit", "client.env", "client.sweep",
    "client.bisect", "server.demo", "engine.run_local", "client.configs", "client.notify", "engine.selftest",
    "client.suite",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    import importlib

    parser = argparse.ArgumentParser(prog="parity", description="Megatron-Core resume-parity service")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"service.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: run a subcommand; configuration errors are one line on stderr and exit code 2."""
    from service.cli.common import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"parity: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
