"""Per-step metrics of the uninterrupted (baseline) and resumed runs, with their deltas."""

from __future__ import annotations

from sqlalchemy import ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base


class StepMetric(Base):
    __tablename__ = "step_metrics"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(primary_key=True)
    loss_baseline: Mapped[float | None]
    loss_resumed: Mapped[float | None]
    lr_baseline: Mapped[float | None]
    lr_resumed: Mapped[float | None]
    loss_abs_delta: Mapped[float | None]
    loss_rel_delta: Mapped[float | None]
    lr_abs_delta: Mapped[float | None]
    lr_rel_delta: Mapped[float | None]
    grad_norm_baseline: Mapped[float | None]
    grad_norm_resumed: Mapped[float | None]
    num_zeros_baseline: Mapped[float | None]
    num_zeros_resumed: Mapped[float | None]
    wall_s_baseline: Mapped[float | None]
    wall_s_resumed: Mapped[float | None]
    within_tolerance: Mapped[bool | None]
