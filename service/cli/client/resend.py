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
import uuid
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, stop_after_attempt

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


def _unknown_outcome(state: RetryCallState) -> bool:
    # sent again only when the request may have arrived: a refused connection never reached the service
    outcome = state.outcome
    assert outcome is not None
    if outcome.failed:
        exc = outcome.exception()
        return isinstance(exc, httpx.TransportError) and not isinstance(exc, (httpx.ConnectError,
                                                                              httpx.ConnectTimeout))
    return outcome.result().status_code in RESENT_STATUSES


def _last(state: RetryCallState) -> httpx.Response:
    assert state.outcome is not None
    return state.outcome.result()  # the last response, or the last send's error raised


def post_resent(client: httpx.Client, path: str, *, json: Any, key: str, who: str = "parity") -> httpx.Response:
    """POST json to path with Idempotency-Key key, sent again (same key) while the outcome is unknown."""
    headers = {"Idempotency-Key": key}

    def wait(state: RetryCallState) -> float:
        assert state.outcome is not None
        resp = None if state.outcome.failed else state.outcome.result()
        return _wait_s(resp, WAITS_S[state.attempt_number - 1])

    def say(state: RetryCallState) -> None:
        assert state.outcome is not None and state.next_action is not None
        if state.outcome.failed:
            exc = state.outcome.exception()
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        else:
            why = f"{state.outcome.result().status_code} {_detail(state.outcome.result())}"
        print(f"{who}: POST {path} (send {state.attempt_number}): {why[:300]}; sending it again in "
              f"{state.next_action.sleep:.0f} s with the same Idempotency-Key", file=sys.stderr)

    retrying = Retrying(retry=_unknown_outcome, stop=stop_after_attempt(len(WAITS_S) + 1), wait=wait,
                        before_sleep=say, retry_error_callback=_last)
    return retrying(client.post, path, json=json, headers=headers)
