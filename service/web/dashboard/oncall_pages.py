"""Dashboard pages of the on-call path: login/logout, open regressions, acknowledge (CSRF-protected)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import select

from models import ApiToken, Regression, Run
from service.core.deps import RowId, SessionDep, SettingsDep
from service.core.errors import DomainError
from service.core.tokens import hash_token
from service.oncall import regressions as regression_tracker
from service.web.dashboard.auth import (
    COOKIE,
    LOGIN_CSRF_AGE_S,
    DashboardRead,
    LoginRequired,
    ViewerDep,
    check_csrf,
    end_session,
    live_token,
    login_csrf_matches,
    login_csrf_token,
    login_redirect_url,
    make_cookie,
    read_cookie,
    safe_next,
)
from service.web.dashboard.rendering import PageError, render

router = APIRouter(include_in_schema=False, default_response_class=HTMLResponse)
LOGIN_CSRF = "parity_login_csrf"


async def form_data(request: Request) -> dict[str, str]:
    """The urlencoded form body as a flat dict (last value wins); no multipart on these forms."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


FormDep = Annotated[dict[str, str], Depends(form_data)]


def _secure(settings_url: str | None) -> bool:
    return bool(settings_url and settings_url.startswith("https://"))


def login_required_handler(request: Request, exc: Exception) -> Response:
    """Redirect a page that needs a login to the login form."""
    assert isinstance(exc, LoginRequired)
    return RedirectResponse(login_redirect_url(exc.next_url, exc.reason), status_code=303)


@router.get("/login")
def login_form(request: Request, settings: SettingsDep, viewer: ViewerDep, next: str = "/", reason: str = "",
               error: str = "") -> Response:
    """The login form: paste an API token; a double-submit cookie protects it against login CSRF."""
    request.state.viewer = viewer
    signed = login_csrf_token(settings)
    response = render(request, "login.html", {"next": safe_next(next), "reason": reason, "error": error,
                                               "login_csrf": signed})
    response.set_cookie(LOGIN_CSRF, signed, httponly=True, samesite="strict", secure=_secure(settings.public_url),
                        max_age=LOGIN_CSRF_AGE_S, path="/login")
    return response


@router.post("/login")
def login(request: Request, session: SessionDep, settings: SettingsDep, form: FormDep) -> Response:
    """Exchange a valid token for a signed session cookie."""
    next_url = safe_next(form.get("next", "/"))
    if not login_csrf_matches(settings, form.get("csrf", ""), request.cookies.get(LOGIN_CSRF, "")):
        raise PageError(403, "login form expired or forged: reload the login page and try again")
    token = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(form.get("token", "").strip()),
                                                  *live_token()))
    if token is None:
        return RedirectResponse(f"/login?next={quote(next_url, safe='')}&error=unknown,+revoked+or+expired+token",
                                status_code=303)
    response = RedirectResponse(next_url, status_code=303)
    response.set_cookie(COOKIE, make_cookie(settings, token), httponly=True, samesite="strict",
                        secure=_secure(settings.public_url), max_age=settings.session_max_age_s, path="/")
    response.delete_cookie(LOGIN_CSRF, path="/login")
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, settings: SettingsDep, viewer: ViewerDep, form: FormDep) -> Response:
    """End the session on the server too (the form carries the CSRF token, so no page elsewhere can log
    anyone out): deleting the cookie alone left a copied cookie valid until it expired."""
    if viewer.via == "session" and not check_csrf(settings, viewer, form):
        raise PageError(403, "logout form forged or expired")
    if viewer.via == "session":
        body, _ = read_cookie(settings, request.cookies.get(COOKIE, ""))
        if body is not None:
            end_session(session, body)
    response = RedirectResponse("/login?reason=logged+out", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/regressions")
def regressions_page(request: Request, session: SessionDep, _: DashboardRead, state: str = "unresolved") -> Response:
    """Open regressions (or those in another state), newest first."""
    if state not in (*regression_tracker.STATES, "unresolved"):
        state = "unresolved"
    rows = regression_tracker.list_regressions(session, state=state, limit=200)
    return render(request, "regressions.html", {"rows": rows, "state": state, "now": datetime.now(UTC)})


@router.get("/regressions/{regression_id}")
def regression_page(request: Request, regression_id: RowId, session: SessionDep, viewer: DashboardRead) -> Response:
    """One regression: its runs, its owner, and the acknowledge form."""
    try:
        reg = regression_tracker.get_regression(session, regression_id)
    except DomainError as exc:
        raise PageError(404, exc.detail) from None
    runs = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(
        [*reg.failing_run_ids, reg.last_good_run_id or 0, reg.fixed_by_run_id or 0])))}
    # the suite runs (PR gate runs) its failing runs belong to: the group this regression is listed under
    suite_runs = sorted({sr for rid in reg.failing_run_ids if rid in runs
                         and (sr := (runs[rid].labels or {}).get("suite_run"))})
    return render(request, "regression.html", {"reg": reg, "runs": runs, "viewer": viewer, "now": datetime.now(UTC),
                                               "suite_runs": suite_runs})


@router.post("/regressions/{regression_id}/acknowledge")
def acknowledge(regression_id: RowId, session: SessionDep, settings: SettingsDep, viewer: DashboardRead,
                form: FormDep) -> Response:
    """Acknowledge from the dashboard: needs a login that may write, and this session's CSRF token."""
    if not viewer.can_write:
        raise LoginRequired(f"/regressions/{regression_id}", "log in with a submit token to acknowledge")
    if not check_csrf(settings, viewer, form):
        raise PageError(403, "forged or expired form: reload the page and try again")
    try:
        regression_tracker.acknowledge(session, regression_id, grant=viewer, note=form.get("note", "")[:4000],
                                       upstream_url=form.get("upstream_url", "").strip() or None)
    except DomainError as exc:
        raise PageError(exc.status_code, exc.detail) from None
    return RedirectResponse(f"/regressions/{regression_id}", status_code=303)


def open_regression_count(session: SessionDep) -> int:
    """How many regressions are unresolved (for the overview's link)."""
    from sqlalchemy import func

    return session.scalar(select(func.count()).where(Regression.state.in_(regression_tracker.UNRESOLVED))) or 0
