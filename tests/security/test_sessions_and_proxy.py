"""Who the dashboard thinks you are: proxy headers only from the proxy, logout ends the session, `next` encoded."""

from __future__ import annotations

import re
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from models import ApiToken
from service.cli.server.serve import server_options
from service.core.settings import get_settings
from service.web.dashboard.auth import make_cookie
from tests.plugins.server import configure, serve

PROXY = "10.1.2.3"  # the configured reverse proxy; the attacker connects from 127.0.0.1


def _viewer(html: str) -> str | None:
    found = re.search(r'<span id="viewer">([^<]*)</span>', html)
    return found.group(1) if found else None


def test_a_spoofed_forwarded_for_does_not_make_a_client_the_proxy(committed_db: str, monkeypatch) -> None:
    configure(monkeypatch, PARITY_PROXY_USER_HEADER="X-Forwarded-User", PARITY_PROXY_ADDRESSES=PROXY)
    attack = {"X-Forwarded-For": PROXY, "X-Forwarded-User": "mallory"}
    with serve(**server_options(get_settings())) as url:
        page = httpx.get(f"{url}/", headers=attack, timeout=60)
    assert page.status_code == 200
    assert _viewer(page.text) is None, "the client's own X-Forwarded-For made it the trusted proxy"


def test_the_configured_proxy_still_names_its_user(committed_db: str, monkeypatch) -> None:
    configure(monkeypatch, PARITY_PROXY_USER_HEADER="X-Forwarded-User", PARITY_PROXY_ADDRESSES="127.0.0.1")
    with serve(**server_options(get_settings())) as url:
        page = httpx.get(f"{url}/", headers={"X-Forwarded-User": "alice"}, timeout=60)
    assert _viewer(page.text) == "alice"


def test_uvicorn_defaults_would_let_the_attack_through(committed_db: str, monkeypatch) -> None:
    """The control: uvicorn's own defaults (proxy headers on, trusting 127.0.0.1) are what the issue exploited."""
    configure(monkeypatch, PARITY_PROXY_USER_HEADER="X-Forwarded-User", PARITY_PROXY_ADDRESSES=PROXY)
    with serve() as url:
        page = httpx.get(f"{url}/", headers={"X-Forwarded-For": PROXY, "X-Forwarded-User": "mallory"}, timeout=60)
    assert _viewer(page.text) == "mallory"
    assert server_options(get_settings())["proxy_headers"] is False


def _login(client: TestClient, secret: str) -> str:
    nonce = client.get("/login").cookies.get("parity_login_csrf")
    resp = client.post("/login", data={"csrf": nonce, "token": secret, "next": "/"}, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    return str(resp.cookies.get("parity_session"))


def test_logout_ends_the_session_on_the_server(committed_db: str, monkeypatch, tokens) -> None:
    configure(monkeypatch, PARITY_READS_REQUIRE_TOKEN="1", PARITY_SESSION_SECRET="s" * 32)
    secret = tokens("alice", "submit")
    from service.web.app import create_app

    with TestClient(create_app()) as client:
        cookie = _login(client, secret)
        assert client.get("/", follow_redirects=False).status_code == 200
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/").text)
        assert csrf is not None
        assert client.post("/logout", data={"csrf": csrf.group(1)}, follow_redirects=False).status_code == 303
    with TestClient(create_app()) as thief:  # someone who copied the cookie before the logout
        thief.cookies.set("parity_session", cookie)
        resp = thief.get("/", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login"), "a logged-out cookie still works"


@pytest.mark.parametrize("next_url", ["/runs?a=1&error=you+are+hacked", "/x#frag&reason=y"])
def test_login_failure_keeps_next_encoded(client: TestClient, next_url: str) -> None:
    nonce = client.get("/login").cookies.get("parity_login_csrf")
    resp = client.post("/login", data={"csrf": nonce, "token": "prt_wrong", "next": next_url}, follow_redirects=False)
    assert resp.status_code == 303
    query = parse_qs(urlsplit(resp.headers["location"]).query)
    assert query["next"] == [next_url]  # one parameter, intact: nothing leaked into the login page's own
    assert query["error"] == ["unknown, revoked or expired token"] and "reason" not in query


def _refusal(app: FastAPI, cookie: str) -> str:
    """Why a page that needs a login sends someone carrying only this session cookie back to /login."""
    with TestClient(app) as someone:
        someone.cookies.set("parity_session", cookie)
        resp = someone.get("/runs", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login"), resp.text
    return parse_qs(urlsplit(resp.headers["location"]).query).get("reason", [""])[0]


def test_a_tampered_or_expired_session_cookie_is_refused(committed_db: str, monkeypatch, tokens) -> None:
    configure(monkeypatch, PARITY_READS_REQUIRE_TOKEN="1", PARITY_SESSION_SECRET="s" * 32)
    secret = tokens("alice", "submit")
    from service.web.app import create_app

    app = create_app()
    with TestClient(app) as client:
        cookie = _login(client, secret)
        page = client.get("/runs", follow_redirects=False)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert page.status_code == 200 and csrf is not None
    engine = create_engine(committed_db)
    with Session(engine) as session:
        row = session.scalars(select(ApiToken).where(ApiToken.name == "alice")).one()
        settings = get_settings()
        expired = make_cookie(settings, row, now=time.time() - settings.session_max_age_s - 5)
        fresh = make_cookie(settings, row)
        other_key = make_cookie(settings.model_copy(update={"session_secret": "t" * 32}), row)
    engine.dispose()
    assert _refusal(app, expired) == "session expired"
    flipped = cookie[:5] + ("A" if cookie[5] != "A" else "B") + cookie[6:]  # one character of the signed body
    for tampered in (flipped, cookie[:-2], other_key, csrf.group(1), fresh.replace(".", "..", 1), "x" * 40):
        assert _refusal(app, tampered) == "invalid session", tampered
    with TestClient(app) as someone:  # the control: the same cookie, untouched, still works
        someone.cookies.set("parity_session", fresh)
        assert someone.get("/runs", follow_redirects=False).status_code == 200
