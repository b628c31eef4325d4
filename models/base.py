"""Declarative base with a constraint naming convention and timezone-aware timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, MetaData
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names make Alembic autogenerate and downgrades predictable.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Current time in UTC, timezone-aware."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Base class of every table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: DateTime(timezone=True)}


class CreatedAt:
    """Mixin: a creation timestamp set by the application."""

    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
