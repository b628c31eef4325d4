"""Who may act: API tokens and the dashboard sessions ended by logout."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


# API tokens: only a SHA-256 hash is stored; scopes decide what a token may do.
class ApiToken(CreatedAt, Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSONB, default=list)
    # the tracks (fnmatch patterns) this token's runs may write: a run's `branch` label, else its
    # environment's name, must match one (admin: any); tokens made before 0016 were given ["*"]
    tracks: Mapped[list[str]] = mapped_column(JSONB, default=list, server_default="[]")
    revoked_at: Mapped[datetime | None]
    # None: never expires
    expires_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


# Dashboard sessions ended by logout: a signed cookie stays valid until it expires unless listed here.
class EndedSession(Base):
    __tablename__ = "ended_sessions"

    # the cookie's random session id; rows past expires_at are useless (the cookie has expired) and pruned
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(index=True)
