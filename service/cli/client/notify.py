"""`parity notify list`: the notification channels configured on the service, with their outbox counts."""

from __future__ import annotations

import argparse
import sys

import httpx

from service.cli.client.config import service_target


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("notify", help="notification channels (configured through POST /api/v1/notifications/channels)")
    nsub = p.add_subparsers(dest="notify_command", required=True)
    listing = nsub.add_parser("list", help="list channels: name, kind, URL, events, outbox counts")
    listing.add_argument("--url", help="service URL (default PARITY_SERVICE_URL)")
    listing.add_argument("--token", help="admin bearer token (default PARITY_TOKEN)")
    listing.set_defaults(func=list_channels)


def list_channels(args: argparse.Namespace) -> int:
    """Print one line per channel; exit 2 when the service cannot be asked."""
    url, token = service_target(args, "notify")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(f"{url}/api/v1/notifications/channels", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        print(f"parity notify: cannot reach {url}: {exc}", file=sys.stderr)
        return 2
    if resp.status_code != 200:
        print(f"parity notify: {resp.status_code} {resp.text[:300]}", file=sys.stderr)
        return 2
    channels = resp.json()
    if not channels:
        print("no notification channels")
    for c in channels:
        counts = ", ".join(f"{n} {state}" for state, n in sorted(c["outbox"].items())) or "nothing sent yet"
        events = ", ".join(c["events"]) or "all events"
        print(f"{c['id']:>3} {c['name']:<20} {c['kind']:<8} {c['url']}  [{events}]  "
              f"{'signed' if c['signed'] else 'unsigned'}  {counts}")
    return 0
