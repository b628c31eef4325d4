"""API tokens: created by `parity token create`, stored as SHA-256 hashes, checked per request."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models import ApiToken
from models.base import utcnow
from service.errors import Forbidden, Unauthorized

SCOPES = ("submit", "admin", "read")
TOKEN_PREFIX = "prt_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, *, name: str, scopes: list[str]) -> str:
    """Create a token with scopes and return its secret (shown once, never stored)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ValueError(f"scopes: unknown {', '.join(unknown) or '(none given)'}; allowed: {', '.join(SCOPES)}")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, token_hash=hash_token(secret), scopes=sorted(set(scopes))))
    session.flush()
    return secret


def authenticate(session: Session, *, token: str | None, scope: str) -> ApiToken:
    """The token row if token is valid and has scope (admin implies every scope)."""
    if not token:
        raise Unauthorized("Authorization: a bearer token is required")
    row = session.scalar(
        select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    )
    if row is None:
        raise Unauthorized("Authorization: unknown or revoked token")
    if scope not in row.scopes and "admin" not in row.scopes:
        raise Forbidden(f"Authorization: token {row.name!r} lacks scope {scope!r} (has {', '.join(row.scopes)})")
    # bookkeeping only, at most once a minute: every CI request writing the same row would serialise them
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        session.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
    return row
