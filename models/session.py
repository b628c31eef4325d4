"""Dashboard sessions ended by logout: a signed cookie stays valid until it expires unless listed here."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base


class EndedSession(Base):
    __tablename__ = "ended_sessions"

    # the cookie's random session id; rows past expires_at are useless (the cookie has expired) and pruned
    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(index=True)
