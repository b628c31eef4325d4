"""One edge check for every string a client sends: what Postgres cannot store is a 422 naming the field.

Postgres refuses NUL in text and jsonb, and psycopg cannot encode an unpaired surrogate (JSON's
"\\ud800"); either reaching a query was a 500. Route by route validators miss fields (46 such 500s were
found), so one app-wide dependency checks path parameters, query parameters, the headers the service
stores, JSON bodies and form bodies before any route runs.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import Request
from pydantic import AfterValidator

from service.core.errors import InvalidSpec
from service.core.limits import STREAMED

# a JSON escape that decodes to NUL or to a surrogate (only these can smuggle them in: raw control
# characters are invalid JSON); a paired surrogate is legal and passes the walk below
_SUSPECT_JSON = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])|\x00")
STORED_HEADERS = ("idempotency-key",)
# Postgres timestamps go far beyond this, but Python's datetime stops at year 9999: arithmetic or a
# time-zone shift near it overflowed (until=9999-12-31 was a 500); nothing the service stores is outside
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)
MAX_OFFSET = 2**31 - 1


def problem(value: str) -> str | None:
    """Why Postgres would refuse value, or None."""
    if "\x00" in value:
        return "contains a NUL character, which cannot be stored"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate, which is not valid UTF-8"
    return None


def find_problem(value: Any, path: str) -> tuple[str, str] | None:
    """The first (field path, why) in a JSON value whose strings (keys included) Postgres would refuse."""
    if isinstance(value, str):
        why = problem(value)
        return (path, why) if why else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            why = problem(str(key))
            if why:
                return where, f"key {why}"
            found = find_problem(item, where)
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = find_problem(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _refuse(field: str, why: str) -> None:
    raise InvalidSpec(f"{field}: {why}", field=field)


async def refuse_unstorable(request: Request) -> None:
    """App-wide dependency: 422 for any path, query, stored header, JSON or form string Postgres refuses."""
    for name, value in request.path_params.items():
        if isinstance(value, str) and (why := problem(value)):
            _refuse(name, why)
    for key, value in request.query_params.multi_items():
        if why := problem(key) or problem(value):
            _refuse(key if not problem(key) else "query", why)
    for header in STORED_HEADERS:
        value = request.headers.get(header)
        if value is not None and (why := problem(value)):
            _refuse(header, why)
    if request.method in ("GET", "HEAD", "OPTIONS") or request.scope.get(STREAMED):
        return  # an upload's body is its route's alone: read only after its token is checked
    body = await request.body()
    if not body:
        return
    kind = request.headers.get("content-type", "")
    if "application/x-www-form-urlencoded" in kind:
        for key, value in parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True):
            if why := problem(key) or problem(value):
                _refuse(key if not problem(key) else "form", why)
    elif _SUSPECT_JSON.search(body):
        try:
            document = json.loads(body)
        except ValueError:
            return  # malformed JSON is the route's own 422
        found = find_problem(document, "")
        if found:
            _refuse(found[0] or "body", found[1])


def _bounded(value: datetime) -> datetime:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if not EARLIEST <= aware <= LATEST:
        raise ValueError(f"must be between {EARLIEST.date()} and {LATEST.date()}")
    return aware


# a date-time query parameter the database and Python's datetime can both hold (naive means UTC)
Instant = Annotated[datetime, AfterValidator(_bounded)]
