"""A POST that queues work, sent again while the service cannot say whether it did.

A 502/503/504 (the database dropped the connection under the insert, or is away, or a proxy lost
the service) or a connection that broke after the request went out leaves the outcome unknown: the
run may be queued or not. The service never sends such an insert again itself, since that could
queue the run twice. The client does, with the same Idempotency-Key: the service then returns the run
it queued the first time, or queues it now. Never two.

A refused connection (nothing listening) is not sent again: that is "cannot reach", reported at once.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import httpx

from service.cli.client.env import _detail

RESENT_STATUSES = {502, 503, 504}
WAITS_S = (1.0, 2.0, 4.0, 8.0)  # four more sends, ~15 s in all: a database restart, not an outage
MAX_RETRY_AFTER_S = 10.0


def new_key() -> str:
    """An Idempotency-Key for one invocation that gave none: its sends are one request to the service."""
    return f"parity-client-{uuid.uuid4().hex}"


def _wait_s(resp: httpx.Response | None, default: float) -> float:
    if resp is None:
        return default
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(resp.headers.get("Retry-After", default))))
    except ValueError:
        return default


def post_resent(client: httpx.Client, path: str, *, json: Any, key: str, who: str = "parity") -> httpx.Response:
    """POST json to path with Idempotency-Key key, sent again (same key) while the outcome is unknown."""
    headers = {"Idempotency-Key": key}
    for attempt, default in enumerate((*WAITS_S, None)):
        resp: httpx.Response | None = None
        try:
            resp = client.post(path, json=json, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise  # the request never reached the service
        except httpx.TransportError as exc:
            if default is None:
                raise
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            if resp.status_code not in RESENT_STATUSES or default is None:
                return resp
            why = f"{resp.status_code} {_detail(resp)}"
        wait = _wait_s(resp, default)
        print(f"{who}: POST {path} (send {attempt + 1}): {why[:300]}; sending it again in {wait:.0f} s "
              "with the same Idempotency-Key", file=sys.stderr)
        time.sleep(wait)
    raise AssertionError("unreachable")

