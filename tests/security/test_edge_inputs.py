"""Strings Postgres refuses, huge numbers and dates, non-ASCII secrets: each a 4xx naming the field, never a 500.

These were five root causes of the 46 responses ≥ 500 the issue found; each test below sends one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3}


def _refused(resp, field: str) -> None:
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == field, resp.json()


@pytest.mark.parametrize(("path", "field"), [
    ("/api/v1/runs?config=a%00b", "config"),
    ("/api/v1/runs?environment=%00", "environment"),
    ("/api/v1/runs?label=branch%3D%00", "label"),
    ("/api/v1/regressions?track=x%00", "track"),
    ("/api/v1/environments/a%00b", "name"),
    ("/api/v1/environments/a%00b/log", "name"),
    ("/runs?config=%00", "config"),
])
def test_nul_in_a_query_or_path_parameter_is_a_422_naming_it(client: TestClient, path: str, field: str) -> None:
    _refused(client.get(path), field)


def test_nul_or_a_lone_surrogate_in_a_json_body_is_a_422_naming_the_field(client: TestClient, make_token) -> None:
    submit, admin = make_token("submit"), make_token("admin")
    _refused(client.post("/api/v1/runs", headers=submit, json={"spec": SPEC, "labels": {"branch": "a\x00"}}),
             "labels.branch")
    _refused(client.post("/api/v1/runs", headers=submit, json={"spec": {**SPEC, "config": "x\x00"}}), "spec.config")
    raw = b'{"spec": {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3}, "labels": {"pr": "\\ud800"}}'
    _refused(client.post("/api/v1/runs", headers={**submit, "Content-Type": "application/json"}, content=raw),
             "labels.pr")
    _refused(client.post("/api/v1/notifications/channels", headers=admin,
                         json={"name": "x", "kind": "slack", "url": "https://93.184.215.14/\x00"}), "url")
    _refused(client.post("/api/v1/known-failures", headers=admin,
                         json={"signature": "x", "link": "https://e.org", "note": "\x00"}), "note")
    # a paired surrogate (an emoji) is ordinary text and is stored
    ok = client.post("/api/v1/runs", headers=submit, json={"spec": SPEC, "labels": {"pr": "fix \U0001f600"}})
    assert ok.status_code == 202, ok.text


def test_nul_in_a_dashboard_form_is_a_422(client: TestClient) -> None:
    resp = client.post("/login", content=b"csrf=a&token=%00&next=/",
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    _refused(resp, "token")


@pytest.mark.parametrize(("query", "field"), [
    ("offset=9223372036854775808", "offset"),
    ("offset=2147483648", "offset"),
    ("until=9999-12-31", "until"),
    ("since=0001-01-01", "since"),
    ("until=9999-12-31T23:59:59%2B14:00", "until"),
])
def test_offsets_and_dates_out_of_range_are_a_422(client: TestClient, query: str, field: str) -> None:
    _refused(client.get(f"/api/v1/runs?{query}"), f"query.{field}")


def test_dashboard_dates_out_of_range_are_reported_on_the_page(client: TestClient) -> None:
    resp = client.get("/runs?until=9999-12-31")
    assert resp.status_code == 200 and "until: expected a date between" in resp.text


def _cookie(**values: str) -> dict[str, bytes]:
    # raw UTF-8 bytes on the wire, as a hostile client sends them (httpx itself only writes ASCII cookies)
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in values.items()).encode()}


def test_non_ascii_session_cookie_and_csrf_values_are_refused_not_500(client: TestClient) -> None:
    for forged in ("é.é", "eyJ0aWQiOjF9.ñ", "x.☃"):
        resp = client.get("/", headers=_cookie(parity_session=forged))  # type: ignore[arg-type]
        assert resp.status_code == 200, resp.text  # anonymous: the forged cookie is ignored
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    resp = client.post("/login", content="csrf=ü&token=x&next=/".encode(), follow_redirects=False,
                       headers={**form, **_cookie(parity_login_csrf="ü")})  # type: ignore[dict-item]
    assert resp.status_code in (303, 403), resp.text  # compared as bytes, then "unknown token" or refused
    resp = client.post("/login", content="csrf=ß&token=x&next=/".encode(), follow_redirects=False,
                       headers={**form, **_cookie(parity_login_csrf="abc")})  # type: ignore[dict-item]
    assert resp.status_code == 403


def test_a_logged_in_write_with_a_non_ascii_csrf_value_is_403(client: TestClient, make_token) -> None:
    secret = make_token("submit")["Authorization"].removeprefix("Bearer ")
    nonce = client.get("/login").cookies.get("parity_login_csrf")
    assert client.post("/login", data={"csrf": nonce, "token": secret, "next": "/"},
                       follow_redirects=False).status_code == 303
    resp = client.post("/logout", data={"csrf": "ǅ"}, follow_redirects=False)
    assert resp.status_code == 403


def test_a_registered_python_that_prints_nothing_is_a_422(client: TestClient, make_token, tmp_path: Path) -> None:
    silent = tmp_path / "python"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    liar = tmp_path / "python-liar"
    liar.write_text('#!/bin/sh\necho \'["not", "a", "dict"]\'\n')
    liar.chmod(0o755)
    admin = make_token("admin")
    for python in (silent, liar):
        resp = client.post("/api/v1/environments", headers=admin, json={"name": python.name, "python": str(python)})
        _refused(resp, "python")
        assert "did not report torch and megatron.core versions" in resp.json()["detail"]
    assert os.access(silent, os.X_OK)
