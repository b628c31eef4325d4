"""`parity bisect`: the first environment of an ordered list on which a check fails; prints it with links."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from service.cli.client.env import _client_args, _detail, client
from service.cli.client.shape_arg import add_shape_argument, parse_shape


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bisect", help="find the first environment (of an ordered list) on which a check fails",
        description="Runs the check on the middle environment until the first bad one is found, reusing "
        "verdicts already stored for the same check and environment. Exit 0 when found, 2 otherwise.",
    )
    p.add_argument("--check", help="key of a stored check (16 hex digits, as `parity submit` prints); "
                   "or give the spec with --config etc.")
    p.add_argument("--config")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-step", type=int, default=3)
    p.add_argument("--workaround", action="append", default=[])
    add_shape_argument(p)
    p.add_argument("--track", help="bisect the track's commits between the check's last pass and first failure "
                   "(with --check; each commit between is built when a step needs it)")
    p.add_argument("--good", help="environment where the check passes (oldest)")
    p.add_argument("--bad", help="environment where it fails (newest)")
    p.add_argument("--between", action="append", default=[], help="environments in between, in order (repeatable)")
    p.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    p.add_argument("--no-wait", dest="wait", action="store_false", help="print the bisect's id and link, then exit")
    p.add_argument("--timeout", type=float, default=7200)
    _client_args(p)
    p.set_defaults(func=run)


def build_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /bisects body from command-line options."""
    if args.track:
        if args.check is None:
            raise SystemExit("parity bisect --track: give --check KEY (the check that broke on the track)")
        return {"check": args.check}
    if args.good is None or args.bad is None:
        raise SystemExit("parity bisect: give --good and --bad environments (or --track and --check)")
    if (args.check is None) == (args.config is None):
        raise SystemExit("parity bisect: give --check KEY or --config (and the other spec options)")
    body: dict[str, Any] = {"good": args.good, "bad": args.bad, "between": args.between,
                            "labels": dict(item.partition("=")[::2] for item in args.label)}
    if args.check:
        body["check"] = args.check
    else:
        spec: dict[str, Any] = {"config": args.config, "dp": args.dp, "steps": args.steps,
                                "save_step": args.save_step, "workarounds": args.workaround}
        if args.shape:
            spec["shape"] = parse_shape(args.shape)
        body["spec"] = spec
    return body


def report(doc: dict[str, Any]) -> str:
    """The bisect as lines: each environment's verdict and run link, then the answer."""
    lines = [f"bisect {doc['id']}: check {doc['check_key']} ({doc['check_name']})"]
    for e in doc["environments"]:
        run = e["run"]
        what = "—" if run is None else (
            f"{run.get('label') or run['verdict'] or run['state']}  {run['link']}"
            + ("  (stored verdict reused)" if run["reused"] else ""))
        mark = "  <- first bad" if e["first_bad"] else ""
        commit = f"  {e['commit']['subject'][:50]}" if e.get("commit") else ""
        lines.append(f"  {e['index']:>2} {e['environment']:<28} {e['role']:<8} {what}{mark}{commit}")
    if doc["state"] == "found" and doc.get("first_bad_commit"):
        bad, good = doc["first_bad_commit"], doc.get("last_good_commit") or {}
        lines.append(f"first bad commit: {bad['sha']} {bad['subject']}  {doc['links']['first_bad_run'] or ''}".rstrip())
        lines.append(f"last good commit: {good.get('sha', '?')} {good.get('subject', '')}")
    elif doc["state"] == "found":
        lines.append(f"first bad: {doc['first_bad']} {doc['links']['first_bad_run'] or ''}".rstrip())
        lines.append(f"last good: {doc['last_good']} {doc['links']['last_good_run'] or ''}".rstrip())
    elif doc["state"] == "error":
        lines.append(f"stopped: {doc['error_message']}")
    lines.append(f"runs created: {doc['runs_created']}, stored verdicts reused: {doc['runs_reused']}")
    lines.append(f"dashboard: {doc['links']['dashboard']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    body = build_body(args)
    with client(args) as http:
        resp = http.post(f"/api/v1/tracks/{args.track}/bisect" if args.track else "/api/v1/bisects", json=body)
        if resp.status_code != 202:
            print(f"parity bisect: {resp.status_code} {_detail(resp)}", file=sys.stderr)
            return 2
        doc = resp.json()
        print(f"bisect {doc['id']}: {doc['links']['dashboard']}", file=sys.stderr)
        deadline = time.monotonic() + args.timeout
        while args.wait and doc["state"] == "running" and time.monotonic() < deadline:
            time.sleep(5)
            doc = http.get(f"/api/v1/bisects/{doc['id']}").json()  # the scheduler advances it; a GET reads
        print(report(doc))
        return 0 if doc["state"] == "found" else 2
