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
    "engine.calibrate", "engine.shrink",
    "client.suite", "server.pythons", "client.track",
)
# The base install is the client; these commands need an extra (and are named here so the client can say so).
NEEDS_EXTRA = {
    "server.serve": "serve", "server.scheduler": "scheduler", "server.db": "db", "server.token": "token",
    "server.demo": "demo", "server.pythons": "pythons", "engine.run_local": "run-local", "engine.selftest": "selftest",
}
ENGINE_MODULES = {"torch", "megatron", "numpy"}
PIP_NAME = "megatron-resume-parity"


def extra_for(module: str | None, command: str = "") -> str:
    """Which extra brings a missing module: engine for torch/Megatron, else service."""
    root = (module or "").split(".")[0]
    return "engine" if root in ENGINE_MODULES or (command.startswith("engine.") and root in ("submitit", "psutil")) \
        else "service"


def missing_extra_message(command: str, exc: ModuleNotFoundError) -> str:
    """One line naming the extra to install for a command whose dependencies are not installed."""
    extra = extra_for(exc.name, command)
    return (f"parity {command.split('.')[-1].replace('_', '-')}: needs the [{extra}] extra "
            f"(pip install '{PIP_NAME}[{extra}]', or [all]); missing module {exc.name!r}")


def _stub(sub: argparse._SubParsersAction, module: str, exc: ModuleNotFoundError) -> None:
    """Register a command whose module cannot be imported here: it says which extra to install."""
    p = sub.add_parser(NEEDS_EXTRA.get(module, module.split(".")[-1]), add_help=False,
                       help=f"(needs the [{extra_for(exc.name, module)}] extra)")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def explain(_: argparse.Namespace) -> int:
        print(missing_extra_message(module, exc), file=sys.stderr)
        return 2

    p.set_defaults(func=explain)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    import importlib

    parser = argparse.ArgumentParser(prog="parity", description="Megatron-Core resume-parity service")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"service.cli.{name}")
        except ModuleNotFoundError as exc:  # a client-only install: the command says which extra it needs
            if exc.name and exc.name.split(".")[0] in ("service", "jobs", "models"):
                raise
            _stub(sub, name, exc)
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: run a subcommand; configuration errors are one line on stderr and exit code 2."""
    from service.cli.common import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if hasattr(sys.stdout, "reconfigure"):  # CI gives a pipe or a file: a line must not wait for the block to fill
        sys.stdout.reconfigure(line_buffering=True)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"parity: configuration error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a command that imports the service or engine lazily
        if exc.name and exc.name.split(".")[0] in ("service", "jobs", "models"):
            raise
        module = {cmd: mod for mod, cmd in NEEDS_EXTRA.items()}.get(str(args.command), str(args.command))
        print(missing_extra_message(module, exc), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
