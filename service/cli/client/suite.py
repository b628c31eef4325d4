"""`parity suite apply|list|show`, and the suite-run half of `parity submit --suite`: queue, wait, report once."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from jobs.verdict_names import ERROR, FAIL, PASS
from service.cli.client.ci_report import exit_code_of, reading_of, suite_junit_xml, suite_summary
from service.cli.client.config import add_client_args, http_client
from service.cli.client.env import _detail
from service.cli.client.forge import Forge
from service.cli.client.progress import HEARTBEAT_S, TERMINAL, Heartbeat, environment_of, waiting_for
from service.cli.client.resend import post_resent
from service.cli.client.waiting import WaitFailed, long_poll
from service.core.state_names import QUEUED_RUN_STATE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("suite", help="suites: named, versioned lists of checks (apply needs an admin token)")
    ssub = p.add_subparsers(dest="suite_command", required=True)
    a = ssub.add_parser("apply", help="define or update a suite from a YAML file (name, description, checks)")
    a.add_argument("file", type=Path)
    ssub.add_parser("list", help="every suite (newest version)")
    s = ssub.add_parser("show", help="one suite as JSON")
    s.add_argument("name")
    s.add_argument("--version", type=int)
    for q in ssub.choices.values():
        add_client_args(q)
        q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with http_client(args) as http:
        if args.suite_command == "apply":
            doc = yaml.safe_load(args.file.read_text())
            if not isinstance(doc, dict):
                print(f"parity suite apply: {args.file} is not a mapping (name, description, checks)", file=sys.stderr)
                return 2
            resp = http.post("/api/v1/suites", json={k: doc[k] for k in ("name", "description", "checks") if k in doc})
            if resp.status_code not in (200, 201):
                print(f"parity suite apply: {resp.status_code} {_detail(resp)}", file=sys.stderr)
                return 2
            suite = resp.json()
            print(f"suite {suite['name']} version {suite['version']} "
                  f"({'new' if resp.status_code == 201 else 'unchanged'}): {len(suite['checks'])} checks")
            return 0
        if args.suite_command == "list":
            for suite in http.get("/api/v1/suites").json():
                print(f"{suite['name']:<24} v{suite['version']:<4} {len(suite['checks']):>3} checks  "
                      f"{', '.join(c['name'] for c in suite['checks'])}")
            return 0
        resp = http.get(f"/api/v1/suites/{args.name}", params={"version": args.version} if args.version else {})
        print(json.dumps(resp.json(), indent=2))
        return 0 if resp.status_code == 200 else 2


def check_line(check: dict[str, Any]) -> str:
    """One check of a suite run in one line: name, the service's reading (label — cause; step; bound), triage link."""
    run = check["run"]
    return f"{check['name']:<28} {reading_of(run)['line']}  {run['links']['triage']}"


def outcome_of(view: dict[str, Any], *, timed_out: bool, strict: bool) -> str:
    """pass | fail | error for the whole suite run, as its exit code says (service/core/outcome.py)."""
    return {0: PASS, 1: FAIL}.get(exit_code_of(view, timed_out=timed_out, strict=strict), ERROR)


def submit_suite(http: httpx.Client, *, suite: str, environment: str, labels: dict[str, str], wait: bool,
                 timeout: float, junit: Path | None, summary: Path | None, strict: bool,
                 forge: Forge | None, key: str, heartbeat_s: float = HEARTBEAT_S) -> int:
    """POST the suite run, post a pending status, wait, report: exit 0 pass, 1 fail/regression, 2 error.

    key is the suite run's Idempotency-Key: a send whose outcome is unknown (a 503, a broken
    connection) is sent again with it, and cannot queue the suite twice.
    """
    resp = post_resent(http, "/api/v1/suite-runs", json={"suite": suite, "environment": environment, "labels": labels},
                       key=key, who="parity submit")
    if resp.status_code != 202:
        print(f"parity submit: {resp.status_code} {_detail(resp)}", file=sys.stderr, flush=True)
        if forge:
            forge.post("error", url=str(http.base_url), description=f"suite {suite} could not be queued")
        return 2
    view = resp.json()
    link = view["links"]["dashboard"]
    pulse = Heartbeat(every=heartbeat_s)
    pulse.say(f"suite run {view['id']} queued ({view['suite']} v{view['version']}, {len(view['checks'])} checks "
              f"on {view['environment']}): {link}")
    if forge:
        forge.post("pending", url=link, description=f"resume parity: {len(view['checks'])} checks queued")
    if not wait:
        return 0
    started = time.monotonic()
    reported: set[str] = set()
    while True:
        for check in view["checks"]:  # one line per check as it ends, in the order they end
            if check["run"]["state"] in TERMINAL and check["name"] not in reported:
                reported.add(check["name"])
                pulse.say(check_line(check))
        if view["state"] == "finished" or time.monotonic() - started >= timeout:
            break
        if pulse.due():
            runs = [c["run"] for c in view["checks"]]
            queued = any(r["state"] == QUEUED_RUN_STATE for r in runs)
            pulse.beat(waiting_for(runs, environment_of(http, view["environment"]) if queued else None))
        try:  # answered when one of its runs changed, else at MAX_WAIT_S or when the heartbeat is due
            view = long_poll(http, f"/api/v1/suite-runs/{view['id']}/wait", after=view["changes"],
                             deadline=started + timeout, hold_s=pulse.until_due())
        except WaitFailed as exc:  # refused, or the service stayed away past the timeout: not a verdict
            print(f"parity submit: {exc}", file=sys.stderr, flush=True)
            if forge:
                forge.post("error", url=link, description="the suite's verdict could not be read")
            return 2
    timed_out = view["state"] != "finished"
    outcome = outcome_of(view, timed_out=timed_out, strict=strict)
    for check in view["checks"]:
        if check["name"] not in reported:
            pulse.say(check_line(check))
    counts = ", ".join(f"{n} {k}" for k, n in view["counts"].items() if n)
    pulse.say(f"suite verdict: {outcome} ({counts})" + (" (timed out)" if timed_out else "") + f"  {link}")
    if junit:
        junit.write_bytes(suite_junit_xml(view, timed_out=timed_out, strict=strict))
    if summary:
        with summary.open("a") as fh:  # $GITHUB_STEP_SUMMARY is appended to, never replaced
            fh.write(suite_summary(view, outcome=outcome))
    if forge:
        forge.post(outcome, url=link, description=f"resume parity {outcome}: {counts}")
    return exit_code_of(view, timed_out=timed_out, strict=strict)
