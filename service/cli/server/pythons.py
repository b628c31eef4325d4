"""`parity pythons`: list the Pythons builds may use, and prepare the shared torch base of one.

With PARITY_JOB_USER set, builds run as the job user and may not write the shared base venvs
(<builds folder>/pythons/<X.Y>): a base one build wrote would be code every later build on that
Python imports. So the service's own user prepares them once, here, before builds need them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pythons", help="the Pythons builds may use; prepare a shared torch base")
    psub = p.add_subparsers(dest="pythons_command", required=True)
    psub.add_parser("list", help="the configured Pythons (PARITY_PYTHONS or discovered)").set_defaults(func=list_)
    prep = psub.add_parser("prepare", help="build the shared torch base venv of X.Y (as the service's user)")
    prep.add_argument("version", help="a configured Python, e.g. 3.12")
    prep.set_defaults(func=prepare)


def list_(_: argparse.Namespace) -> int:
    from service.core.settings import get_settings
    from service.environments import interpreters

    for version, path in interpreters.configured(get_settings().pythons).items():
        print(f"{version}\t{path}")
    return 0


def prepare(args: argparse.Namespace) -> int:
    from service.core.settings import get_settings
    from service.environments import interpreters, recipe
    from service.environments.python_base import ensure_base
    from service.environments.registry import builds_folder

    settings = get_settings()
    pythons = interpreters.configured(settings.pythons)
    if args.version not in pythons:
        print(f"parity pythons prepare: version must be one of {sorted(pythons)} (PARITY_PYTHONS), "
              f"not {args.version!r}", file=sys.stderr)
        return 2
    if args.version == interpreters.own_python()[0]:
        print(f"Python {args.version} is the service's own: its builds share the service's torch, nothing to prepare")
        return 0
    builds = builds_folder(settings)
    builds.mkdir(parents=True, exist_ok=True)
    log = builds / f"python-{args.version}-base.log"
    pins = recipe.base_pins([f"{d.metadata['Name']}=={d.version}" for d in recipe.closure()])
    site = ensure_base(builds, args.version, pythons[args.version], pins, recipe._run, log)
    print(f"Python {args.version} base ready: {Path(site)} (log {log})")
    return 0
