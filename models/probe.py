"""Evidence gathered by the job's probes: misaligned params, fingerprint differences, bucket offsets."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base
from models.jsonsafe import SafeJSONB


class ProbeFinding(Base):
    __tablename__ = "probe_findings"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    phase: Mapped[str] = mapped_column(String(32))
    probe: Mapped[str] = mapped_column(String(64))
    ok: Mapped[bool] = mapped_column(Boolean)
    param_name: Mapped[str | None] = mapped_column(String(500))
    detail: Mapped[dict[str, Any]] = mapped_column(SafeJSONB, default=dict)
