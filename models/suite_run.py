"""A suite run: every check of one suite version queued on one environment, answered as one verdict."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt


class SuiteRun(CreatedAt, Base):
    __tablename__ = "suite_runs"
    __table_args__ = (UniqueConstraint("token_id", "idempotency_key", name="uq_suite_runs_token_id_idempotency_key"),)

    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    suite_id: Mapped[int] = mapped_column(ForeignKey("suites.id"), index=True)
    environment: Mapped[str] = mapped_column(String(200))
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    requester: Mapped[str | None] = mapped_column(String(200))
    # a CI retry with the same Idempotency-Key (per token) gets this suite run back instead of a second one
    token_id: Mapped[int | None]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    # [{"name": check name, "run_id": id}, ...] in the suite's order
    runs: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
