"""An uploaded build (a wheel or sdist), stored once per SHA-256 under the artifact folder.

A requirement line `artifact:<sha256>` builds an environment from it. `state` is `stored` while the
file is on disk and `pruned` once retention deleted it (uploading the same bytes again restores it).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class Artifact(CreatedAt, Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    # the file name pip needs to recognise it (a wheel's name carries its tags)
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(8))  # wheel | sdist
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(String(1000))
    uploaded_by: Mapped[str | None] = mapped_column(String(200))
    # the token whose upload stored these bytes first: its quota counts them (None: before 0016)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="stored", server_default="stored", index=True)
    last_used_at: Mapped[datetime | None]
