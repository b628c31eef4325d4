"""API tokens: created by `parity token create`, stored as SHA-256 hashes, checked per request."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models import ApiToken
from models.base import utcnow
from service.core.errors import Forbidden, Unauthorized
from service.core.tracks import check_patterns

# build: may install any requirement line in a service-built environment (submit: only PARITY_BUILD_ALLOW)
SCOPES = ("submit", "build", "admin", "read")
TOKEN_PREFIX = "prt_"
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_NAME = 200  # api_tokens.name and runs.requester are 200 characters


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    session: Session, *, name: str, scopes: list[str], tracks: list[str] | None = None,
    expires_in: timedelta | None = None,
) -> str:
    """Create a token with scopes, the tracks it may write (and, if given, an expiry); return its secret.

    The secret is shown once and never stored. A token that may queue runs (submit, not admin) must name
    its tracks (fnmatch patterns: 'pr-*', 'main', or '*' for any): a track's history is its owners'.
    """
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ValueError(f"scopes: unknown {', '.join(unknown) or '(none given)'}; allowed: {', '.join(SCOPES)}")
    if not 1 <= len(name) <= MAX_NAME:
        raise ValueError(f"name: must be 1 to {MAX_NAME} characters, got {len(name)}")
    patterns = check_patterns(tracks or [])
    if not patterns and "submit" in scopes and "admin" not in scopes:
        raise ValueError("tracks: a submit token must name the tracks (branch labels) it may write, e.g. "
                         "--track 'pr-*' for CI's pull requests, --track main for the main branch, --track '*' for any")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    expires_at = utcnow() + expires_in if expires_in is not None else None
    session.add(ApiToken(name=name, token_hash=hash_token(secret), scopes=sorted(set(scopes)), tracks=patterns,
                         expires_at=expires_at))
    session.flush()
    return secret


def list_tokens(session: Session) -> list[ApiToken]:
    """Every token, oldest first (hashes only; secrets are never stored)."""
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, *, token_id: int) -> ApiToken:
    """Revoke one token by id (idempotent: a revoked token keeps its first revocation time)."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise LookupError(f"token {token_id} does not exist")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    session.flush()
    return row


def authenticate(session: Session, *, token: str | None, scope: str | None) -> ApiToken:
    """The token row if token is valid and has scope (admin implies every scope; None: any scope will do)."""
    if not token:
        raise Unauthorized("Authorization: a bearer token is required")
    row = session.scalar(
        select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    )
    if row is None:
        raise Unauthorized("Authorization: unknown or revoked token")
    if row.expires_at is not None and row.expires_at <= utcnow():
        raise Unauthorized(f"Authorization: token {row.name!r} expired at {row.expires_at.isoformat()}")
    if scope is not None and scope not in row.scopes and "admin" not in row.scopes:
        raise Forbidden(f"Authorization: token {row.name!r} lacks scope {scope!r} (has {', '.join(row.scopes)})")
    # bookkeeping only, at most once a minute: every CI request writing the same row would serialise them
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
        session.execute(update(ApiToken).where(ApiToken.id == row.id).values(last_used_at=now))
    return row
