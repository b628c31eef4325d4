"""Known upstream bugs: on these environments (names or a Megatron-Core version range), signature S is known."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class KnownFailure(CreatedAt, Base):
    __tablename__ = "known_failures"

    id: Mapped[int] = mapped_column(primary_key=True)
    signature: Mapped[str] = mapped_column(String(100), index=True)
    # environment names it applies to; empty = any environment whose build matches mcore_versions
    environments: Mapped[list[str]] = mapped_column(JSONB, default=list)
    # a PEP 440 specifier set on the Megatron-Core version, e.g. "<=0.16.1"; empty = any version
    mcore_versions: Mapped[str] = mapped_column(String(200), default="")
    link: Mapped[str] = mapped_column(String(1000))
    note: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str | None] = mapped_column(String(200))
    retired_at: Mapped[datetime | None]
