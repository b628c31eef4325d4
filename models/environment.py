"""An environment: the Python (or command prefix) that runs job phases, and its package versions."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class Environment(CreatedAt, Base):
    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Executable handed to submitit's `python` option, e.g. "/opt/mcore-main/bin/python".
    python: Mapped[str] = mapped_column(String(1000))
    description: Mapped[str] = mapped_column(String(2000), default="")
    # Package versions as recorded by the jobs that ran in it (torch, megatron-core, ...).
    packages: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
