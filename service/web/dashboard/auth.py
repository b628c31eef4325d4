"""Dashboard login: a bearer token exchanged for a signed, HttpOnly, SameSite session cookie, or a
trusted reverse proxy's user header (from configured proxy addresses only); CSRF tokens for writes.

The cookie holds {token id, name, expiry, session id, csrf nonce} signed with HMAC-SHA256; every request
re-checks that the token still exists unrevoked (revoking a token ends its dashboard sessions too) and
that the session was not ended by logout (ended_sessions): a copied cookie dies with the logout.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from sqlalchemy import delete, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import ApiToken, EndedSession
from models.base import utcnow
from service.core.deps import SessionDep, SettingsDep
from service.core.settings import Settings
from service.core.tokens import authenticate

COOKIE = "parity_session"


@dataclass(frozen=True)
class Viewer:
    """Who is looking at the dashboard, and what they may change."""

    name: str
    via: str  # session | proxy | bearer | anonymous
    can_write: bool
    csrf: str = ""


ANONYMOUS = Viewer(name="", via="anonymous", can_write=False)


class LoginRequired(Exception):
    """Reads need a login: the handler redirects to /login (with why, and where to come back to)."""

    def __init__(self, next_url: str, reason: str = "") -> None:
        super().__init__(reason)
        self.next_url, self.reason = next_url, reason


@lru_cache
def _process_secret() -> bytes:
    return secrets.token_bytes(32)


def _key(settings: Settings) -> bytes:
    # without PARITY_SESSION_SECRET sessions are per process: a restart logs everyone out, nothing leaks
    return settings.session_secret.encode() if settings.session_secret else _process_secret()


def _mac(settings: Settings, data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(_key(settings), data, hashlib.sha256).digest()).decode().rstrip("=")


def make_cookie(settings: Settings, token: ApiToken, *, now: float | None = None) -> str:
    """A signed session value for token, valid for session_max_age_s."""
    body = {"tid": token.id, "name": token.name, "exp": int((now or time.time()) + settings.session_max_age_s),
            "sid": secrets.token_urlsafe(24), "csrf": secrets.token_urlsafe(16)}
    data = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")
    return f"{data}.{_mac(settings, data.encode())}"


def read_cookie(settings: Settings, value: str) -> tuple[dict[str, Any] | None, str]:
    """The session body if value is authentic and unexpired; -> (body, why not)."""
    data, _, mac = value.partition(".")
    # bytes, not str: compare_digest raises TypeError on a non-ASCII str (a forged cookie was a 500)
    if not data or not hmac.compare_digest(mac.encode(), _mac(settings, data.encode()).encode()):
        return None, "invalid session"
    try:
        body = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
    except ValueError:
        return None, "invalid session"
    if not isinstance(body, dict) or not isinstance(body.get("sid"), str) or not isinstance(body.get("tid"), int):
        return None, "invalid session"  # a cookie from before session ids existed: log in again
    if int(body.get("exp", 0)) < time.time():
        return None, "session expired"
    return body, ""


def end_session(session: Session, body: dict[str, Any]) -> None:
    """Logout: record the session id as ended until the cookie would expire anyway (and forget old ones)."""
    now = utcnow()
    session.execute(delete(EndedSession).where(EndedSession.expires_at < now))
    expires = datetime.fromtimestamp(int(body["exp"]), UTC)
    session.execute(insert(EndedSession).values(session_id=body["sid"], expires_at=expires)
                    .on_conflict_do_nothing(index_elements=["session_id"]))


def live_token() -> tuple[Any, ...]:
    """WHERE clauses of a token that may still be used: not revoked, not expired."""
    return (ApiToken.revoked_at.is_(None), or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > utcnow()))


def _proxy_user(request: Request, settings: Settings) -> str | None:
    if not settings.proxy_user_header:
        return None
    allowed = {a.strip() for a in settings.proxy_addresses.split(",") if a.strip()}
    peer = request.client.host if request.client else ""
    # a header from anywhere else is ignored: anyone could send it
    if peer not in allowed:
        return None
    user = request.headers.get(settings.proxy_user_header, "").strip()
    return user[:200] or None


def current_viewer(request: Request, session: SessionDep, settings: SettingsDep) -> Viewer:
    """Who this request is, from the proxy header, the session cookie, or a bearer token."""
    user = _proxy_user(request, settings)
    if user:
        return Viewer(name=user, via="proxy", can_write=True, csrf=_mac(settings, f"proxy:{user}".encode()))
    raw = request.cookies.get(COOKIE)
    if raw:
        body, why = read_cookie(settings, raw)
        if body is not None:
            ended = select(EndedSession.session_id).where(EndedSession.session_id == body["sid"]).exists()
            token = session.scalar(select(ApiToken).where(ApiToken.id == body["tid"], ~ended, *live_token()))
            if token is not None:
                writes = bool({"submit", "admin"} & set(token.scopes))
                return Viewer(name=token.name, via="session", can_write=writes, csrf=str(body["csrf"]))
            why = "logged out, or token revoked or expired"
        request.state.session_problem = why
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        token = authenticate(session, token=header[7:].strip(), scope="read")
        return Viewer(name=token.name, via="bearer", can_write=False)
    return ANONYMOUS


ViewerDep = Annotated[Viewer, Depends(current_viewer)]


def require_dashboard_read(request: Request, viewer: ViewerDep, settings: SettingsDep) -> Viewer:
    """Pages are open unless PARITY_READS_REQUIRE_TOKEN is set; then a login (or proxy user) is needed."""
    request.state.viewer = viewer
    if settings.reads_require_token and viewer.via == "anonymous":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target, getattr(request.state, "session_problem", ""))
    return viewer


DashboardRead = Annotated[Viewer, Depends(require_dashboard_read)]


def check_csrf(viewer: Viewer, form: dict[str, str]) -> bool:
    """A dashboard write is genuine when it carries this viewer's CSRF token (constant-time compare)."""
    sent = form.get("csrf", "")
    return bool(viewer.csrf) and bool(sent) and hmac.compare_digest(sent.encode(), viewer.csrf.encode())


def login_redirect_url(next_url: str, reason: str = "") -> str:
    """/login with where to return and why (only local paths are accepted as next)."""
    url = f"/login?next={quote(safe_next(next_url), safe='')}"
    return url + (f"&reason={quote(reason)}" if reason else "")


def safe_next(next_url: str) -> str:
    """Only same-site absolute paths: never an open redirect."""
    return next_url if next_url.startswith("/") and not next_url.startswith("//") and "\\" not in next_url else "/"
