"""A hostile client against every operation of the OpenAPI document: 0 responses >= 500.

Two passes over the real app and the real Postgres:
1. schemathesis: cases generated from each operation's schema (valid and invalid), with an admin token
   (so requests get past auth into the handlers) or none, a bounded number per operation;
2. a fixed hostile matrix: every path and query parameter, and every top-level body field, set in turn
   to NUL strings, unpaired surrogates, huge numbers and dates; reserved labels; non-ASCII session
   cookies and CSRF values on every operation and on the dashboard's forms.
The figures (operations x cases, responses >= 500) are printed for the closing note.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.plugins.server import configure

# per operation and generation mode: the PR tier takes a short pass, the nightly tier the full one (about
# a minute for the whole document on one core); the hostile matrix runs whole in both
SHORT_PASS, FULL_PASS = 1, 12
NUL, SURROGATE = "a\x00b", "\ud800"
HUGE = ["9223372036854775808", "-9223372036854775809", "1e309", "99999999999999999999999999"]
DATES = ["9999-12-31", "0001-01-01", "9999-12-31T23:59:59+14:00", "-1"]
RESERVED = [{"bisect": "0123456789ab"}, {"sweep": "0123456789ab", "variation": "base"}, {"selftest": "x"}]
ODD_COOKIES = [b"parity_session=\xc3\xa9.\xc3\xa9", b"parity_session=eyJ0aWQiOjF9.\xe2\x98\x83",
               b"parity_login_csrf=\xc3\xbc"]


class Tally:
    """Every response, counted by operation; every one >= 500 kept with what caused it."""

    def __init__(self) -> None:
        self.cases: Counter[str] = Counter()
        self.errors: list[str] = []

    def record(self, operation: str, status: int, what: str, body: str) -> None:
        """Count one response."""
        self.cases[operation] += 1
        if status >= 500:
            self.errors.append(f"{operation} -> {status} for {what[:300]}: {body[:300]}")


@pytest.fixture
def fuzz_app(committed_db: str, monkeypatch: pytest.MonkeyPatch, tokens) -> Iterator[tuple[Any, dict[str, str]]]:
    configure(monkeypatch, PARITY_MAX_QUEUED_PER_REQUESTER="100000", PARITY_MAX_IN_FLIGHT="100000")
    from service.web.app import create_app

    yield create_app(), {"Authorization": f"Bearer {tokens('fuzz-admin', 'admin')}"}


def _generated(app: Any, admin: dict[str, str], tally: Tally, cases: int) -> int:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    with TestClient(app, raise_server_exceptions=False) as client:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    _send_generated(client, operation, mode, admin, tally, cases)
                except Unsatisfiable:  # nothing in this operation can be made invalid (no parameters, no body)
                    pass
    return len(operations)


def _send_generated(client: TestClient, operation: Any, mode: GenerationMode, admin: dict[str, str],
                    tally: Tally, cases: int) -> None:
    name = f"{operation.method.upper()} {operation.path}"
    calls = [0]

    @settings(max_examples=cases, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        calls[0] += 1
        headers = {**(case.headers or {}), **(admin if calls[0] % 4 else {})}  # every fourth case: no token
        kwargs = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
        response = client.request(**{k: v for k, v in kwargs.items()
                                     if k in ("method", "url", "headers", "params", "json", "content", "data",
                                              "files", "cookies")})
        tally.record(name, response.status_code, f"{case.path_parameters} {case.query} {case.body!r}", response.text)

    send()


def _example_path(path: str, params: dict[str, str]) -> str:
    for name, value in params.items():
        path = path.replace("{" + name + "}", quote(value, safe=""))
    return path


def _hostile(app: Any, admin: dict[str, str], tally: Tally) -> None:
    document = app.openapi()
    strings = [NUL, *HUGE, *DATES]
    with TestClient(app, raise_server_exceptions=False) as client:

        def send(name: str, method: str, url: str, **kwargs: Any) -> None:
            response = client.request(method, url, **kwargs)
            tally.record(name, response.status_code, f"{url} {kwargs.get('content') or kwargs.get('json')!r}",
                         response.text)

        for path, methods in document["paths"].items():
            for method, spec in methods.items():
                name = f"{method.upper()} {path}"
                params = spec.get("parameters", [])
                base = {p["name"]: "1" for p in params if p["in"] == "path"}
                for param in params:
                    for value in strings:
                        if param["in"] == "path":
                            send(name, method, _example_path(path, {**base, param["name"]: value}), headers=admin)
                        elif param["in"] == "query":
                            send(name, method, _example_path(path, base), params={param["name"]: value},
                                 headers=admin)
                        elif param["in"] == "header":
                            send(name, method, _example_path(path, base), headers={**admin, param["name"]: value})
                for cookie in ODD_COOKIES:  # no login needed to reach compare_digest
                    send(name, method, _example_path(path, base), headers={"Cookie": cookie})  # type: ignore[dict-item]
                body = spec.get("requestBody", {}).get("content", {}).get("application/json")
                if body is None:
                    continue
                ref = body["schema"].get("$ref", "")
                model = document["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
                for field in model.get("properties", {}):
                    hostile: list[Any] = [NUL, SURROGATE, 2**63, -(2**63) - 1, 10**400, "9999-12-31", {"k\x00": "v"}]
                    for value in hostile:
                        send(name, method, _example_path(path, base), content=json.dumps({field: value}).encode(),
                             headers={**admin, "Content-Type": "application/json"})
                if "labels" in model.get("properties", {}):
                    for labels in RESERVED:
                        send(name, method, _example_path(path, base), json={"labels": labels, "spec": {}},
                             headers=admin)
        # the dashboard's forms (not in the OpenAPI document): odd CSRF values and NULs, logged in or not
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        for url in ("/login", "/logout", "/regressions/1/acknowledge"):
            for content in ("csrf=%C3%BC&token=x&next=/", "csrf=%00&note=%00", "csrf=\u2603".encode(),
                            b"csrf=\xff\xfe&next=//evil.example"):
                for cookie in ODD_COOKIES:
                    send(f"POST {url}", "POST", url, content=content,
                         headers={**form, "Cookie": cookie})  # type: ignore[dict-item]
        for url in ("/", "/runs", "/regressions", "/login"):
            for query in ("until=9999-12-31", "since=0001-01-01", "page=99999999999999999999", "config=%00",
                          "next=%00", "label=a%3D%00"):
                send(f"GET {url}", "GET", f"{url}?{query}")


@pytest.mark.slow
@pytest.mark.parametrize("cases", [pytest.param(SHORT_PASS, id="short"),
                                   pytest.param(FULL_PASS, id="full", marks=pytest.mark.nightly)])
def test_no_response_is_a_server_error(fuzz_app: tuple[Any, dict[str, str]], cases: int) -> None:
    app, admin = fuzz_app
    tally = Tally()
    operations = _generated(app, admin, tally, cases)
    generated = sum(tally.cases.values())
    _hostile(app, admin, tally)
    total = sum(tally.cases.values())
    print(f"\nfuzzer: {operations} OpenAPI operations; {generated} generated cases (schemathesis, "
          f"<= {cases} per operation and mode) + {total - generated} hostile-matrix cases "
          f"= {total} requests over {len(tally.cases)} routes; responses >= 500: {len(tally.errors)}")
    assert not tally.errors, "\n".join(tally.errors[:30])
