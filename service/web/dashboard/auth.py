"""Dashboard login: a bearer token exchanged for a signed, HttpOnly, SameSite session cookie, or a
trusted reverse proxy's user header (from configured proxy addresses only); CSRF tokens for writes.

Signing, expiry and tamper checks are itsdangerous's (`URLSafeTimedSerializer`, HMAC-SHA256): the cookie
holds {token id, name, session id, csrf nonce} with the time it was signed, and is refused once older than
session_max_age_s. Every request re-checks that the token still exists unrevoked (revoking a token ends
its dashboard sessions too) and that the session was not ended by logout (ended_sessions): a copied
cookie dies with the logout. A form's CSRF token is the session's nonce signed the same way (another salt).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from itsdangerous import BadSignature, SignatureExpired, TimestampSigner, URLSafeTimedSerializer
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
    csrf: str = ""  # the token its forms carry: csrf_key, signed
    csrf_key: str = ""  # what a genuine form's token must carry: the session's nonce, or the proxy user
    # what its writes may touch (service/core/tracks.Grant): a session's token's scopes and track patterns
    scopes: tuple[str, ...] = ()
    tracks: tuple[str, ...] = ()


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


class _Signer(TimestampSigner):
    """itsdangerous's timestamp signer, on HMAC-SHA256; `issued_at` backdates what it signs (an expired cookie)."""

    def __init__(self, *args: Any, issued_at: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.issued_at = issued_at

    def get_timestamp(self) -> int:
        """When the value is signed: now, unless backdated."""
        return int(self.issued_at) if self.issued_at is not None else super().get_timestamp()


def _serializer(settings: Settings, salt: str, *, now: float | None = None) -> URLSafeTimedSerializer:
    # a salt per use: a CSRF token is never a session cookie, nor the reverse
    return URLSafeTimedSerializer(_key(settings), salt=f"parity-{salt}", signer=_Signer,
                                  signer_kwargs={"digest_method": hashlib.sha256, "issued_at": now})


def make_cookie(settings: Settings, token: ApiToken, *, now: float | None = None) -> str:
    """A signed session value for token, valid for session_max_age_s from now (or from `now`)."""
    body = {"tid": token.id, "name": token.name, "sid": secrets.token_urlsafe(24), "csrf": secrets.token_urlsafe(16)}
    return _serializer(settings, "session", now=now).dumps(body)


def read_cookie(settings: Settings, value: str) -> tuple[dict[str, Any] | None, str]:
    """The session body (with `exp`, when it expires) if value is authentic and unexpired; -> (body, why not)."""
    try:
        body, signed_at = _serializer(settings, "session").loads(
            value, max_age=settings.session_max_age_s, return_timestamp=True)
    except SignatureExpired:
        return None, "session expired"
    except BadSignature:  # tampered, forged, another key's, or not a session value at all
        return None, "invalid session"
    if not isinstance(body, dict) or not isinstance(body.get("sid"), str) or not isinstance(body.get("tid"), int):
        return None, "invalid session"
    expires = signed_at + timedelta(seconds=settings.session_max_age_s)
    return {**body, "exp": int(expires.timestamp())}, ""


def csrf_token(settings: Settings, key: str) -> str:
    """The token a form carries for a viewer whose csrf_key is key (valid as long as a session)."""
    return _serializer(settings, "csrf").dumps(key)


def _verified(settings: Settings, salt: str, value: str, max_age: int) -> Any:
    """What value carries if it is authentic and younger than max_age; else None."""
    try:
        return _serializer(settings, salt).loads(value, max_age=max_age) if value else None
    except BadSignature:  # SignatureExpired included
        return None


def csrf_matches(settings: Settings, sent: str, key: str) -> bool:
    """sent is an authentic, unexpired CSRF token that carries key."""
    return bool(key) and _verified(settings, "csrf", sent, settings.session_max_age_s) == key


LOGIN_CSRF_AGE_S = 600  # how long a login form stays usable


def login_csrf_token(settings: Settings) -> str:
    """A fresh login-form token: the login form and its double-submit cookie both carry it."""
    return _serializer(settings, "login").dumps(secrets.token_urlsafe(16))


def login_csrf_matches(settings: Settings, sent: str, cookie: str) -> bool:
    """The login form's token and the cookie's are authentic, unexpired and the same nonce (double submit)."""
    nonce = _verified(settings, "login", cookie, LOGIN_CSRF_AGE_S)
    return nonce is not None and _verified(settings, "login", sent, LOGIN_CSRF_AGE_S) == nonce


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
    allowed = set(settings.proxy_addresses)
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
        key = f"proxy:{user}"
        # the proxy authenticates the organisation's own people (PARITY_PROXY_ADDRESSES is the admin's
        # choice): they triage every track, as an on-call engineer does
        return Viewer(name=user, via="proxy", can_write=True, csrf=csrf_token(settings, key), csrf_key=key,
                      scopes=("submit",), tracks=("*",))
    raw = request.cookies.get(COOKIE)
    if raw:
        body, why = read_cookie(settings, raw)
        if body is not None:
            ended = select(EndedSession.session_id).where(EndedSession.session_id == body["sid"]).exists()
            token = session.scalar(select(ApiToken).where(ApiToken.id == body["tid"], ~ended, *live_token()))
            if token is not None:
                writes = bool({"submit", "admin"} & set(token.scopes))
                key = str(body.get("csrf") or "")
                return Viewer(name=token.name, via="session", can_write=writes, csrf=csrf_token(settings, key),
                              csrf_key=key, scopes=tuple(token.scopes), tracks=tuple(token.tracks or ()))
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


def check_csrf(settings: Settings, viewer: Viewer, form: dict[str, str]) -> bool:
    """A dashboard write is genuine when it carries a token signed for this viewer's session (or proxy user)."""
    return csrf_matches(settings, form.get("csrf", ""), viewer.csrf_key)


def login_redirect_url(next_url: str, reason: str = "") -> str:
    """/login with where to return and why (only local paths are accepted as next)."""
    url = f"/login?next={quote(safe_next(next_url), safe='')}"
    return url + (f"&reason={quote(reason)}" if reason else "")


def safe_next(next_url: str) -> str:
    """Only same-site absolute paths: never an open redirect."""
    return next_url if next_url.startswith("/") and not next_url.startswith("//") and "\\" not in next_url else "/"
