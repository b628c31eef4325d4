"""Waiting for a verdict: long polls (the service answers when the run changed, or after at most
MAX_WAIT_S), so a waiting client asks about once per 20 s and still hears of a verdict within a
notification's round trip of it.

A 5xx, an answer that is not the JSON object asked for, or a lost connection is the service
restarting or a proxy in trouble, not a verdict: the poll is sent again with exponential backoff
(tenacity) until the caller's deadline, and then fails as WaitFailed, which the commands turn into
exit 2 ("could not tell"), never exit 1 ("this PR broke resume"). A 4xx (a token refused, an
unknown run) is not retried: it fails at once, the same way.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from service.core.state_names import MAX_WAIT_S

MIN_HOLD_S = 1.0  # a poll holds at least this long: a due heartbeat never turns the wait into a busy loop
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


class WaitFailed(Exception):
    """The wait could not be carried on (refused, or the service stayed away past the deadline): exit 2."""


class _Unanswered(Exception):
    """A 5xx or a malformed answer: worth sending again."""


def document(resp: httpx.Response) -> tuple[dict[str, Any] | None, str]:
    """(the answer's JSON object if the request succeeded with one, else None; what the service said)."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if resp.is_success and isinstance(doc, dict):
        return doc, ""
    return None, f"{doc.get('error', '')}: {doc.get('detail', '')}" if isinstance(doc, dict) else resp.text[:200]


def read_token_hint(resp: httpx.Response) -> str:
    """What a 403 on a read most likely means."""
    return " (a read token is needed: PARITY_READS_REQUIRE_TOKEN is on)" if resp.status_code == 403 else ""


def _answer(resp: httpx.Response, path: str) -> dict[str, Any]:
    doc, detail = document(resp)
    if doc is not None:
        return doc
    if resp.status_code >= 500 or resp.is_success:  # a 200 that is not our document is a proxy's page
        raise _Unanswered(f"GET {path}: {resp.status_code} {detail}")
    raise WaitFailed(f"GET {path}: {resp.status_code} {detail}{read_token_hint(resp)}")


def _say_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0
    print(f"parity submit: poll failed ({exc}); retrying in {wait:.1f} s", file=sys.stderr, flush=True)


def long_poll(client: httpx.Client, path: str, *, after: int, deadline: float,
              hold_s: float = MAX_WAIT_S) -> dict[str, Any]:
    """GET path?after=… (the service answers once past `after`, or at its timeout: at most hold_s, at least
    MIN_HOLD_S); sent again with backoff on a 5xx, a malformed answer or a lost connection until deadline
    (time.monotonic()); WaitFailed then."""

    def past_deadline(_: RetryCallState) -> bool:
        return time.monotonic() >= deadline

    retrying = Retrying(
        retry=retry_if_exception_type((httpx.TransportError, _Unanswered)),
        wait=wait_exponential_jitter(initial=BACKOFF_FIRST_S, max=BACKOFF_MAX_S),
        stop=past_deadline, before_sleep=_say_retry, reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                left = max(MIN_HOLD_S, min(MAX_WAIT_S, hold_s, deadline - time.monotonic()))
                params: dict[str, Any] = {"after": after, "timeout_s": round(left, 1)}
                return _answer(client.get(path, params=params, timeout=left + 30), path)
    except (httpx.TransportError, _Unanswered) as exc:
        raise WaitFailed(f"the service did not answer before the deadline: {exc}") from exc
    raise AssertionError("unreachable: tenacity either returns or raises")
