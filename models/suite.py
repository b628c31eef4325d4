"""A suite: an admin-defined, named, versioned list of named checks (specs) a gate runs together.

Applying a suite whose checks changed stores a new version; the old versions stay, so a suite run
always names exactly what it ran.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class Suite(CreatedAt, Base):
    __tablename__ = "suites"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_suites_name_version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    version: Mapped[int]
    description: Mapped[str] = mapped_column(String(2000), default="")
    # [{"name": "dp2-moe-fp32-router", "spec": {...}}, ...] in the order the suite lists them
    checks: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    created_by: Mapped[str | None] = mapped_column(String(200))
