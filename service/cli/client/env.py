"""`parity env`: list, show, create (a build from requirement lines), register (a prepared Python), prune."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx

from service.cli.client.config import add_client_args, http_client

WAIT_STATES = ("pending", "building")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="environments: list, show, create (build), register, prune")
    esub = p.add_subparsers(dest="env_command", required=True)
    for name, helptext in (("list", "every environment"), ("show", "one environment as JSON")):
        q = esub.add_parser(name, help=helptext)
        if name == "show":
            q.add_argument("name")
        _client_args(q)
        q.set_defaults(func=run)
    c = esub.add_parser("create", help="build an environment from requirement lines (reused when identical)")
    c.add_argument("--requirement", "-r", action="append", required=True,
                   help="megatron-core==X, /abs/path/to/wheel-or-source, git+https://…@sha (repeatable)")
    c.add_argument("--name")
    c.add_argument("--description", default="")
    c.add_argument("--wait", action="store_true", help="wait until the build is ready or failed")
    c.add_argument("--timeout", type=float, default=1800)
    _client_args(c)
    c.set_defaults(func=run)
    r = esub.add_parser("register", help="register a prepared Python (admin token)")
    r.add_argument("--name", required=True)
    r.add_argument("--python", required=True)
    r.add_argument("--description", default="")
    _client_args(r)
    r.set_defaults(func=run)
    pr = esub.add_parser("prune", help="delete virtualenvs of builds unused for --days (default: settings)")
    pr.add_argument("--days", type=float)
    pr.set_defaults(func=prune)


_client_args = add_client_args


def client(args: argparse.Namespace) -> httpx.Client:
    """An HTTP client for the service named by --url/--token or the environment."""
    return http_client(args)


def ensure_build(http: httpx.Client, requirements: list[str], *, name: str | None = None,
                 description: str = "") -> dict[str, Any]:
    """POST the requirement lines; the environment (new or reused) or SystemExit(2) with the error."""
    body: dict[str, Any] = {"requirements": requirements, "description": description}
    if name:
        body["name"] = name
    resp = http.post("/api/v1/environments", json=body)
    if resp.status_code not in (200, 201):
        raise SystemExit(f"parity: environment: {resp.status_code} {_detail(resp)}")
    env: dict[str, Any] = resp.json()
    print(f"environment {env['name']} ({'reused' if resp.status_code == 200 else 'new'}): {env['state']}",
          file=sys.stderr)
    return env


def wait_built(http: httpx.Client, env: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Poll until the build leaves pending/building (or timeout)."""
    deadline = time.monotonic() + timeout
    while env["state"] in WAIT_STATES and time.monotonic() < deadline:
        time.sleep(2)
        env = http.get(f"/api/v1/environments/{env['name']}").json()
    return env


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        return resp.text[:500]


def run(args: argparse.Namespace) -> int:
    with client(args) as http:
        if args.env_command == "list":
            for env in http.get("/api/v1/environments").json():
                print(f"{env['name']:<28} {env['state']:<9} megatron-core {env['megatron_core'] or '?':<10} "
                      f"{' '.join(env['requirements'] or [env['python']])}")
            return 0
        if args.env_command == "show":
            resp = http.get(f"/api/v1/environments/{args.name}")
            print(json.dumps(resp.json(), indent=2))
            return 0 if resp.status_code == 200 else 2
        if args.env_command == "register":
            resp = http.post("/api/v1/environments", json={
                "name": args.name, "python": args.python, "description": args.description})
            if resp.status_code != 201:
                print(f"parity env register: {resp.status_code} {_detail(resp)}", file=sys.stderr)
                return 2
            print(json.dumps(resp.json(), indent=2))
            return 0
        env = ensure_build(http, args.requirement, name=args.name, description=args.description)
        if args.wait:
            env = wait_built(http, env, args.timeout)
        print(json.dumps(env, indent=2))
        return {"ready": 0, "failed": 1}.get(env["state"], 0 if not args.wait else 2)


def prune(args: argparse.Namespace) -> int:
    from service.cli.common import load_settings, ready_database
    from service.core.db import session_scope
    from service.environments.build_steps import prune_builds

    settings = load_settings()
    ready_database(migrate=False)
    with session_scope() as session:
        names = prune_builds(session, keep_days=settings.env_keep_days if args.days is None else args.days)
    print("\n".join(names) or "nothing to prune")
    return 0
