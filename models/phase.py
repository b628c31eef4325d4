"""One launch of one phase of a run (train_and_save or resume); a retry is a new row."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ForeignKey, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from models.base import Base, CreatedAt
from models.jsonsafe import SafeJSONB

if TYPE_CHECKING:
    from models.run import Run


class Phase(CreatedAt, Base):
    __tablename__ = "phases"
    __table_args__ = (Index("ix_phases_state", "state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    # the allowed moves are service/core/phase_state.py's PHASE_TRANSITIONS; every move is a PhaseEvent
    state: Mapped[str] = mapped_column(String(32), default="pending")
    # retry backoff: a pending phase is not launched before this time
    not_before: Mapped[datetime | None]
    executor: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(String(64))
    # the Slurm job name (run, phase, attempt): how a submission cut short by a crash is found again
    job_name: Mapped[str | None] = mapped_column(String(200))
    # local executor: the controller's start time, so a reused pid is never taken for our job
    process_started_at: Mapped[float | None]
    # this attempt's folder (jobs.run_folder): rank logs, documents, checkpoint
    folder: Mapped[str | None] = mapped_column(String(1000))
    # submitit's folder of the job running this phase (a resume forked in its train_and_save job shares it)
    job_folder: Mapped[str | None] = mapped_column(String(1000))
    exit_reason: Mapped[str | None] = mapped_column(Text)
    submitted_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    duration_s: Mapped[float | None]
    save_s: Mapped[float | None]
    load_s: Mapped[float | None]
    info: Mapped[dict[str, Any]] = mapped_column(SafeJSONB, default=dict)
    log_paths: Mapped[list[str]] = mapped_column(JSONB, default=list)

    run: Mapped[Run] = relationship(back_populates="phases", lazy="raise")

    @property
    def rank_nodes(self) -> list[str | None]:
        """Multi-node: the node (hostname) each rank ran on, from the phase's document; [] before it has one."""
        nodes = (self.info or {}).get("rank_nodes")
        return list(nodes) if isinstance(nodes, list) else []
