"""`parity source add|list` and `parity track add|run|list`: Megatron-LM built from a source's commits, watched."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from service.cli.client.config import add_client_args, http_client
from service.cli.client.env import _detail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("source", help="sources of Megatron-LM code: a git URL, a local repository or tree (admin)")
    ssub = p.add_subparsers(dest="source_command", required=True)
    a = ssub.add_parser("add", help="register a source: a git URL or local repository at --ref, or a plain tree")
    a.add_argument("name")
    a.add_argument("location", help="https://…, ssh://…, file://…, git@…, or an absolute local path")
    a.add_argument("--ref", help="branch, tag or commit (a URL without one: main; a local path without one: a tree)")
    ssub.add_parser("list", help="every source")
    for q in ssub.choices.values():
        add_client_args(q)
        q.set_defaults(func=run_source)

    t = sub.add_parser("track", help="tracks: a suite run on a source's latest commit, every so often and on demand")
    tsub = t.add_subparsers(dest="track_command", required=True)
    a = tsub.add_parser("add", help="define a track (admin): e.g. track add main --source mlm --suite gate --every 24h")
    a.add_argument("name")
    a.add_argument("--source", required=True)
    a.add_argument("--suite", required=True)
    a.add_argument("--every", default="24h", help="30m, 24h, 7d … (default 24h)")
    a.add_argument("--auto-bisect", action="store_true", help="bisect the commits when a check goes pass -> fail")
    r = tsub.add_parser("run", help="run the track's suite on its source's latest commit now")
    r.add_argument("name")
    tsub.add_parser("list", help="every track with its last commit, last run and error")
    for q in tsub.choices.values():
        add_client_args(q)
        q.set_defaults(func=run_track)


def _fail(what: str, resp: Any) -> int:
    print(f"parity {what}: {resp.status_code} {_detail(resp)}", file=sys.stderr)
    return 2


def run_source(args: argparse.Namespace) -> int:
    with http_client(args) as http:
        if args.source_command == "add":
            resp = http.post("/api/v1/sources", json={"name": args.name, "location": args.location, "ref": args.ref})
            if resp.status_code != 201:
                return _fail("source add", resp)
            doc = resp.json()
            print(f"source {doc['name']}: {doc['kind']} {doc['location']}" + (f" @ {doc['ref']}" if doc["ref"] else ""))
            return 0
        for doc in http.get("/api/v1/sources").json():
            print(f"{doc['name']:<20} {doc['kind']:<5} {doc['location']}" + (f" @ {doc['ref']}" if doc["ref"] else ""))
        return 0


def track_line(doc: dict[str, Any]) -> str:
    """One track as a line: name, source, suite, period, last commit, next run, error."""
    every = doc["every_seconds"]
    period = f"{every // 86400}d" if every % 86400 == 0 else f"{every // 3600}h" if every % 3600 == 0 else \
        f"{every // 60}m"
    line = (f"{doc['name']:<16} {doc['source']:<16} suite {doc['suite']:<12} every {period:<5} "
            f"{'auto-bisect ' if doc['auto_bisect'] else ''}last commit {(doc['last_commit'] or '-')[:12]} "
            f"suite run {doc['last_suite_run_id'] or '-'} next {doc['next_run_at']}")
    return line + (f"\n  error: {doc['last_error']}" if doc.get("last_error") else "")


def run_track(args: argparse.Namespace) -> int:
    with http_client(args) as http:
        if args.track_command == "add":
            resp = http.post("/api/v1/tracks", json={"name": args.name, "source": args.source, "suite": args.suite,
                                                     "every": args.every, "auto_bisect": args.auto_bisect})
            if resp.status_code != 201:
                return _fail("track add", resp)
            print(track_line(resp.json()))
            return 0
        if args.track_command == "run":
            resp = http.post(f"/api/v1/tracks/{args.name}/run")
            if resp.status_code != 202:
                return _fail("track run", resp)
            print(f"track {args.name}: due now (the scheduler queues its suite on the latest commit)")
            return 0
        for doc in http.get("/api/v1/tracks").json():
            print(track_line(doc))
        return 0
