"""Request limits: bodies over MAX_BODY_BYTES are refused with 413 before anything parses them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import PayloadTooLarge

MAX_BODY_BYTES = 64 * 1024
MAX_LABELS = 32
# set in the ASGI scope of a request whose body is a stream for its route alone: nothing before the
# route (no app-wide dependency) may read it, since the route checks the token first
STREAMED = "parity.streamed_body"


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps({
        "error": "payload_too_large",
        "detail": f"request body: larger than the {limit} bytes allowed",
        "field": None,
    }).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _counted(receive: Receive, limit: int) -> Receive:
    """receive, raising PayloadTooLarge once more than limit body bytes came (rendered as 413 by the app)."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(f"request body: larger than the {limit} bytes allowed")
        return message

    return counted


class BodyLimit:
    """ASGI middleware: 413 for a declared or streamed body over `limit` bytes.

    A Content-Length over the limit is refused before a byte is read; a chunked body is read up to
    limit + 1 bytes and then replayed to the app, so the JSON parser never sees an oversize body.
    `streamed` maps a path to the limit of its own (a callable, read per request): such a route
    takes its body as a stream (an upload). A declared Content-Length over the limit is refused here;
    a chunked one is counted as the route receives it and ends in 413 the moment it passes the limit
    (whoever reads it); it is never buffered, and the scope is marked STREAMED so that nothing but the
    route reads it.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES,
                 streamed: dict[str, Callable[[], int]] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.streamed = dict(streamed or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer 413."""
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        own = self.streamed.get(scope.get("path", ""))
        limit = own() if own is not None else self.limit
        if declared is not None or own is not None:
            try:
                too_big = declared is not None and int(declared) > limit
            except ValueError:
                too_big = False  # the server already rejects a malformed length
            if too_big:
                await _send_413(send, limit)
                return
            if own is None:
                await self.app(scope, receive, send)
                return
            scope[STREAMED] = True
            await self.app(scope, _counted(receive, limit), send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await _send_413(send, self.limit)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
