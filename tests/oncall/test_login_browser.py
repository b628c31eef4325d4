"""Dashboard login in real headless Chromium: login, logout, an expired session, a forged form, proxy users."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from models import Regression
from service.core.settings import get_settings
from service.core.tokens import create_token
from service.web.dashboard.auth import COOKIE, make_cookie
from tests.plugins.browser import screenshot

pytestmark = pytest.mark.browser
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4}


def _seed_regression(database_url: str) -> tuple[str, int]:
    """A submit token and an open regression (pass then fail on main), committed."""
    from service.core.check_spec import run_spec_of
    from service.environments.registry import ensure_default_environment
    from service.runs.records import create_run
    from tests.plugins.verdict_helpers import finish

    engine = create_engine(database_url)
    with Session(engine, expire_on_commit=False) as session:
        token = create_token(session, name="alice", scopes=["submit"], tracks=["*"])
        env = ensure_default_environment(session, settings=get_settings())
        for verdict in ("pass", "fail"):
            run, _ = create_run(session, spec=run_spec_of(SPEC), environment=env, labels={"branch": "main"},
                                requester="t")
            finish(session, run.id, verdict, ["optimizer-index-misalignment"] if verdict == "fail" else [])
        reg_id = session.scalar(select(Regression.id))
        session.commit()
    engine.dispose()
    assert reg_id is not None
    return token, reg_id


def _login(page, token: str) -> None:
    page.fill("input[name=token]", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_load_state("load")


def test_login_then_logout(oncall_page, locked_server, committed_db) -> None:
    page = oncall_page
    token, reg_id = _seed_regression(committed_db)
    assert httpx.get(f"{locked_server}/", follow_redirects=False).status_code == 303  # reads are locked
    page.goto(f"/regressions/{reg_id}")
    assert "/login" in page.url and page.locator("#login-form").count() == 1
    page.fill("input[name=token]", "prt_wrong")
    page.click("#login-form button[type=submit]")
    page.wait_for_load_state("load")
    assert "unknown, revoked or expired token" in page.locator("#login-error").inner_text()
    _login(page, token)
    assert page.url.endswith(f"/regressions/{reg_id}"), page.url  # back where the login started
    assert page.locator("#viewer").inner_text() == "alice"
    cookie = next(c for c in page.context.cookies() if c["name"] == COOKIE)
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert page.evaluate("() => document.cookie").find(COOKIE) == -1  # invisible to scripts
    screenshot(page, "oncall-logged-in")
    page.click("#logout-form button[type=submit]")
    page.wait_for_load_state("load")
    assert "/login" in page.url and "logged out" in page.locator("#login-reason").inner_text()
    page.goto("/")
    assert "/login" in page.url
    assert page.errors == []


@pytest.mark.nightly
def test_expired_session_asks_to_log_in_again(oncall_page, locked_server, committed_db, browser) -> None:
    page = oncall_page
    token, _ = _seed_regression(committed_db)
    engine = create_engine(committed_db)
    from models import ApiToken
    from service.core.tokens import hash_token

    with Session(engine) as session:
        row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        assert row is not None
        stale = make_cookie(get_settings(), row, now=time.time() - get_settings().session_max_age_s - 5)
    engine.dispose()
    page.context.add_cookies([{"name": COOKIE, "value": stale, "url": locked_server}])
    page.goto("/runs")
    assert "/login" in page.url and "session expired" in page.locator("#login-reason").inner_text()
    tampered = stale.replace(".", ".x", 1)
    page.context.add_cookies([{"name": COOKIE, "value": tampered, "url": locked_server}])
    page.goto("/runs")
    assert "/login" in page.url and "invalid session" in page.locator("#login-reason").inner_text()


def test_forged_acknowledge_is_refused(oncall_page, locked_server, committed_db) -> None:
    page = oncall_page
    token, reg_id = _seed_regression(committed_db)
    page.goto(f"/login?next=/regressions/{reg_id}")
    _login(page, token)
    # a form whose CSRF token is not this session's, posted with the session cookie
    page.eval_on_selector("#ack-form input[name=csrf]", "el => el.value = 'forged'")
    page.fill("#ack-form input[name=note]", "not me")
    with page.expect_navigation():
        page.click("#ack-form button[type=submit]")
    assert "forged or expired form" in page.content()
    engine = create_engine(committed_db)
    with Session(engine) as session:
        reg = session.get(Regression, reg_id)
        assert reg is not None and reg.state == "open"
    engine.dispose()
    # a login form posted without the login page's nonce is refused too (no login CSRF)
    resp = page.request.post(f"{locked_server}/login", form={"token": token, "next": "/"}, max_redirects=0)
    assert resp.status == 403
    # the genuine form works
    page.goto(f"/regressions/{reg_id}")
    page.fill("#ack-form input[name=note]", "mine")
    page.click("#ack-form button[type=submit]")
    page.wait_for_load_state("load")
    assert page.locator("#reg-state").inner_text() == "acknowledged"
    assert "alice" in page.locator("#reg-owner").inner_text()


def test_proxy_user_header_only_from_the_proxy(locked_server, committed_db, monkeypatch) -> None:
    monkeypatch.setenv("PARITY_PROXY_USER_HEADER", "X-Forwarded-User")
    monkeypatch.setenv("PARITY_PROXY_ADDRESSES", "127.0.0.1")
    get_settings.cache_clear()
    ok = httpx.get(f"{locked_server}/regressions", headers={"X-Forwarded-User": "bob"}, follow_redirects=False)
    assert ok.status_code == 200 and ">bob<" in ok.text
    monkeypatch.setenv("PARITY_PROXY_ADDRESSES", "10.0.0.7")
    get_settings.cache_clear()
    refused = httpx.get(f"{locked_server}/regressions", headers={"X-Forwarded-User": "bob"}, follow_redirects=False)
    assert refused.status_code == 303  # the same header from an address that is not the proxy: ignored
