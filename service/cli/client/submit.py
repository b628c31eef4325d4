"""`parity submit`: what CI runs — queue a parity run (or a suite) over REST, wait, print, write JUnit, exit 0/1/2.

`--wheel`/`--sdist` upload the pull request's build first and run on an environment built from it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from jobs.verdict_names import PASS
from service.cli.client import forge as forges
from service.cli.client.artifacts import upload
from service.cli.client.ci_report import exit_code_of, junit_xml, reading_of, run_summary
from service.cli.client.config import service_target
from service.cli.client.progress import HEARTBEAT_S, TERMINAL, Heartbeat, environment_of, waiting_for
from service.cli.client.resend import new_key, post_resent
from service.cli.client.spec_args import add_spec_arguments, spec_of
from service.cli.client.waiting import WaitFailed, document, long_poll, read_token_hint
from service.core.state_names import QUEUED_RUN_STATE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="queue a parity run on the service (for CI)")
    p.add_argument("--suite", help="run every check of this suite (parity suite list) as one suite run")
    add_spec_arguments(p)  # --config (or --suite), --dp, --steps, …: one per RunSpec field (spec_args.py)
    p.add_argument("--environment", default="default")
    p.add_argument("--requirement", "-r", action="append", default=[],
                   help="build (or reuse) an environment from these requirement lines and run on it (repeatable)")
    p.add_argument("--wheel", type=Path, action="append", default=[],
                   help="upload this wheel (the PR's build) and run on an environment built from it (repeatable)")
    p.add_argument("--sdist", type=Path, action="append", default=[], help="the same for an sdist")
    p.add_argument("--label", action="append", default=[], help="key=value, repeatable (commit, branch, pr...)")
    p.add_argument("--idempotency-key")
    p.add_argument("--wait", action="store_true", help="wait for the verdict")
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait (with --wait)")
    p.add_argument("--heartbeat", type=float, default=HEARTBEAT_S,
                   help="with --wait: say what it waits for after this many seconds without news (default 30)")
    p.add_argument("--junit", type=Path, help="write a JUnit XML report here")
    p.add_argument("--strict", action="store_true", help="a known-failure verdict exits 1 instead of 0")
    p.add_argument("--summary", type=Path, help="append a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    status = p.add_mutually_exclusive_group()
    status.add_argument("--github-status", action="store_true",
                        help="post commit statuses (GITHUB_REPOSITORY, GITHUB_SHA, GITHUB_TOKEN, GITHUB_API_URL)")
    status.add_argument("--gitlab-status", action="store_true",
                        help="post commit statuses (CI_API_V4_URL, CI_PROJECT_ID, CI_COMMIT_SHA, GITLAB_TOKEN)")
    p.add_argument("--status-context", help="the status's name (default parity/<suite or config>)")
    p.add_argument("--status-sha", help="the commit the status is for (default GITHUB_SHA / CI_COMMIT_SHA)")
    p.add_argument("--url", help="service URL (default PARITY_SERVICE_URL)")
    p.add_argument("--token", help="bearer token (default PARITY_TOKEN)")
    p.set_defaults(func=run)


def build_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /runs body from command-line options."""
    spec = spec_of(args)
    return {"spec": spec, "environment": args.environment, "labels": parse_labels(args.label)}


def parse_labels(items: list[str]) -> dict[str, str]:
    """--label key=value items as a dict."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"parity submit: --label expects key=value, got {item!r}")
        labels[key] = value
    return labels


def _forge(args: argparse.Namespace) -> forges.Forge | None:
    kind = "github" if getattr(args, "github_status", False) else "gitlab" if getattr(args, "gitlab_status", False) \
        else None
    context = getattr(args, "status_context", None) or f"parity/{getattr(args, 'suite', None) or args.config}"
    return forges.from_environment(kind, context=context, sha=getattr(args, "status_sha", None) or None)


def _environment(client: httpx.Client, args: argparse.Namespace) -> str:
    """The environment to run on: built from the uploads and requirement lines, else --environment."""
    requirements = list(args.requirement)
    for path in [*getattr(args, "wheel", []), *getattr(args, "sdist", [])]:
        requirements.append(upload(client, path)["requirement"])
    if not requirements:
        return str(args.environment)
    from service.cli.client.env import ensure_build

    return str(ensure_build(client, requirements)["name"])


def step_table(metrics: dict[str, Any]) -> str:
    """Resumed steps as a fixed-width table."""
    header = ("step", "loss baseline", "loss resumed", "|Δloss|", "lr baseline", "lr resumed")
    lines = ["{:>5} {:>15} {:>15} {:>10} {:>12} {:>12}".format(*header)]
    for s in metrics["steps"]:
        if s["loss_resumed"] is None:
            continue
        delta = abs(s["loss_abs_delta"]) if s["loss_abs_delta"] is not None else float("nan")
        lines.append(
            f"{s['step']:>5} {s['loss_baseline']:>15.8f} {s['loss_resumed']:>15.8f} "
            f"{delta:>10.2e} {s['lr_baseline']:>12.4e} {s['lr_resumed']:>12.4e}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if not (args.config or getattr(args, "suite", None)) or (args.config and getattr(args, "suite", None)):
        print("parity submit: give --config (one check) or --suite (every check of a suite)", file=sys.stderr)
        return 2
    url, token = service_target(args, "submit")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    labels = parse_labels(args.label)
    forge = _forge(args)
    key = args.idempotency_key or new_key()  # a POST sent again is the same request (resend.py)
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        try:
            environment = _environment(client, args)  # runs queue at once and start when the build is ready
            if getattr(args, "suite", None):
                from service.cli.client.suite import submit_suite

                return submit_suite(client, suite=args.suite, environment=environment, labels=labels,
                                    wait=args.wait, timeout=args.timeout, junit=args.junit,
                                    summary=getattr(args, "summary", None), strict=args.strict, forge=forge,
                                    key=key, heartbeat_s=getattr(args, "heartbeat", HEARTBEAT_S))
            body = build_body(args)
            body["environment"] = environment
            resp = post_resent(client, "/api/v1/runs", json=body, key=key, who="parity submit")
        except httpx.HTTPError as exc:
            print(f"parity submit: cannot reach {url}: {exc}", file=sys.stderr)
            if forge:
                forge.post("error", url=url, description="the parity service could not be reached")
            return 2
        if resp.status_code != 202:
            body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
            print(f"parity submit: {resp.status_code} {body.get('error', '')}: {body.get('detail', resp.text)}",
                  file=sys.stderr)
            if forge:
                forge.post("error", url=url, description=f"parity run refused: {resp.status_code}")
            return 2
        run_doc = resp.json()
        pulse = Heartbeat(every=getattr(args, "heartbeat", HEARTBEAT_S))
        pulse.say(f"run {run_doc['id']} queued: {run_doc['links']['dashboard']}")
        pulse.say(f"check {run_doc['check_key']} ({run_doc['check_name']}) on track {run_doc['track']}")
        if forge:
            forge.post("pending", url=run_doc["links"]["triage"], description=f"resume parity: {run_doc['check_name']}")
        if not args.wait:
            return 0
        started = time.monotonic()
        deadline = started + args.timeout
        try:
            while run_doc["state"] not in TERMINAL and time.monotonic() < deadline:
                if pulse.due():
                    queued = run_doc["state"] == QUEUED_RUN_STATE
                    pulse.beat(waiting_for([run_doc], environment_of(client, run_doc["environment"]) if queued
                                           else None))
                # answered when the run changed, else after at most MAX_WAIT_S or when the heartbeat is due
                run_doc = long_poll(client, f"/api/v1/runs/{run_doc['id']}/wait", after=run_doc["state_version"],
                                    deadline=deadline, hold_s=pulse.until_due())
            timed_out = run_doc["state"] not in TERMINAL
            code = report(client, run_doc, timed_out=timed_out, junit=args.junit, strict=args.strict)
        except (ClientFailure, WaitFailed, httpx.HTTPError) as exc:
            # exit 1 means "parity failed": an auth or transport problem must never read as a regression
            print(f"parity submit: {exc}", file=sys.stderr)
            if forge:
                forge.post("error", url=run_doc["links"]["triage"], description="the parity verdict could not be read")
            return 2
        outcome = {0: "pass", 1: "fail"}.get(code, "error")
        if getattr(args, "summary", None):
            with args.summary.open("a") as fh:
                fh.write(run_summary(run_doc, outcome=outcome))
        if forge:
            forge.post(outcome, url=run_doc["links"]["triage"],
                       description=f"resume parity {reading_of(run_doc)['label']}")
        return code


class ClientFailure(Exception):
    """The service refused a read (401, 403, 404, …) or sent no JSON document: exit 2, never 1."""


class ServerBusy(ClientFailure):
    """A 5xx while polling: the service may be restarting; polling carries on."""


def get_json(client: httpx.Client, path: str) -> dict[str, Any]:
    """GET path as a JSON object, or ClientFailure naming the status and the service's error."""
    resp = client.get(path)
    doc, detail = document(resp)
    if doc is not None:
        return doc
    kind = ServerBusy if resp.status_code >= 500 else ClientFailure
    raise kind(f"GET {path}: {resp.status_code} {detail}{read_token_hint(resp)}")


def report(
    client: httpx.Client, run_doc: dict[str, Any], *, timed_out: bool, junit: Path | None, strict: bool = False
) -> int:
    """Print the table, verdict and triage link; write JUnit; return the exit code."""
    if not timed_out:
        metrics = get_json(client, f"/api/v1/runs/{run_doc['id']}/metrics")
        if metrics["steps"]:
            print(step_table(metrics))
    verdict = run_doc.get("verdict")
    print(f"verdict: {reading_of(run_doc)['line']}")
    if run_doc.get("error_message"):
        print(f"error: {run_doc['error_message'][:500]}")
    for known in run_doc.get("known_failures") or []:
        print(f"known upstream bug: {known['signature']} {known['link']}")
    for fixed in run_doc.get("fixed_known") or []:
        print(f"fixed? {fixed['signature']} no longer happens (known failure {fixed['id']}: {fixed['link']})")
    if verdict != PASS or run_doc.get("regression"):  # a clean pass has nothing to triage
        print(f"triage: {run_doc['links']['triage']}")
    if junit:
        junit.write_bytes(junit_xml(run_doc, timed_out=timed_out, strict=strict))
    if timed_out:
        print("parity submit: timed out waiting for a verdict", file=sys.stderr)
    return exit_code_of(run_doc, timed_out=timed_out, strict=strict)  # the server's outcome, as a suite's
