"""A source: where Megatron-LM's code comes from for builds of commits (a git URL or local repository
at a ref, or a plain source tree), registered by an admin. Each resolved commit is one environment."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class Source(CreatedAt, Base):
    __tablename__ = "sources"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # git: a URL or a local repository, resolved at `ref` (branch, tag or commit); tree: a plain folder,
    # named by a hash of its content
    kind: Mapped[str] = mapped_column(String(8))
    location: Mapped[str] = mapped_column(String(1000))
    ref: Mapped[str | None] = mapped_column(String(200))
    created_by: Mapped[str | None] = mapped_column(String(200))
