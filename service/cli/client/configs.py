"""`parity configs`: list the named model configs a run can use."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `configs` subcommand."""
    p = subparsers.add_parser("configs", help="list the named model configs")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Print the configs as a table (or JSON); exit 0."""
    from jobs.config_listing import list_configs

    configs = list_configs()
    if args.json:
        json.dump(configs, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    width = max(len(c["name"]) for c in configs)
    for c in configs:
        print(f"{c['name']:<{width}}  {c['description']}")
        print(f"{'':<{width}}  why: {c['why']}")
        layouts = ", ".join(f"{k} {'|'.join(map(str, v))}" for k, v in c["layouts"].items())
        print(f"{'':<{width}}  layouts: {layouts} (ranks = dp * tp * pp; ep must divide dp)")
        megatron = ", ".join(f"{k}={v}" for k, v in c.get("megatron", {}).items())
        print(f"{'':<{width}}  megatron: {megatron}")
        if c.get("requires"):
            print(f"{'':<{width}}  GPU check: needs {' and '.join(c['requires'])}")
    from service.cli.client.shape_arg import shape_help

    print(f"\n--shape (submit, run-local, bisect): {shape_help()}")
    return 0
