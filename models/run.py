"""A parity run: one validated spec, its state, its verdict, and its place in the history."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from models.base import Base, CreatedAt, utcnow
from models.jsonsafe import SafeJSONB

if TYPE_CHECKING:
    from models.environment import Environment
    from models.phase import Phase


class Run(CreatedAt, Base):
    __tablename__ = "runs"
    __table_args__ = (
        # the history lookup and the dashboard matrix: latest finished run per check × track
        Index("ix_runs_check_track_finished", "check_key", "track", "finished_at"),
        # label filters are containment (@>): jsonb_path_ops indexes one hash per key/value pair
        # instead of one entry per key and one per value, so it is smaller and cheaper to insert into
        Index("ix_runs_labels_path", "labels", postgresql_using="gin", postgresql_ops={"labels": "jsonb_path_ops"}),
        # the one key-existence filter (self-test runs only); a partial index no ordinary run enters
        Index("ix_runs_selftest", "id", postgresql_where=text("labels ? 'selftest'")),
        # verdict and regression filters, newest first; queued runs (no verdict) never enter them
        Index("ix_runs_verdict_id", "verdict", "id", postgresql_where=text("verdict IS NOT NULL")),
        Index("ix_runs_regression_id", "id", postgresql_where=text("regression IS TRUE")),
        # the dashboard's worst-first list of failures (verdict=fail&sort=delta): in its own order, and
        # its predicate is the default view's, so the page walks 50 entries and the count reads no heap
        Index("ix_runs_verdict_delta", "verdict", text("max_abs_loss_delta DESC NULLS LAST"), text("id DESC"),
              postgresql_where=text("verdict IS NOT NULL AND NOT (labels ? 'selftest')")),
        Index("ix_runs_state_created", "state", "created_at"),
        # an Idempotency-Key belongs to the token that sent it: two CI systems may pick the same key
        UniqueConstraint("token_id", "idempotency_key", name="uq_runs_token_id_idempotency_key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    config: Mapped[str] = mapped_column(String(100))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    requester: Mapped[str | None] = mapped_column(String(200))
    # the token that queued the run (None for runs made outside the API)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    rerun_of_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    # the check (service/core/checks.py): hash of the canonical spec, and its readable form
    # (check_key alone is served by ix_runs_check_track_finished, whose first column it is)
    check_key: Mapped[str] = mapped_column(String(16))
    check_name: Mapped[str] = mapped_column(String(500))
    # the history this run belongs to: its branch label, else its environment's name
    track: Mapped[str] = mapped_column(String(200), index=True)

    state: Mapped[str] = mapped_column(String(32), default="queued")
    # bumped on every transition; the scheduler's claim compares it to avoid double work
    state_version: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    submitted_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # consecutive scheduler steps on this run that failed on its data (not an outage); bounded
    scheduler_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # retention (service/runs/retention.py): when the checkpoints, then the whole run folder, were deleted
    checkpoints_deleted_at: Mapped[datetime | None]
    files_deleted_at: Mapped[datetime | None]

    verdict: Mapped[str | None] = mapped_column(String(16))
    signatures: Mapped[list[str]] = mapped_column(JSONB, default=list)
    first_divergent_step: Mapped[int | None]
    first_step_beyond_tolerance: Mapped[int | None]
    max_abs_loss_delta: Mapped[float | None]
    summary: Mapped[dict[str, Any]] = mapped_column(SafeJSONB, default=dict)
    error_message: Mapped[str | None] = mapped_column(Text)

    regression: Mapped[bool] = mapped_column(Boolean, default=False)
    last_good_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    # for "still failing": the run where the current failure streak began
    failing_since_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    # whose history the verdict was compared with: the run's own track, or its base track when the
    # track had no history of its own ("regresses against main"); None when nothing was compared
    compared_track: Mapped[str | None] = mapped_column(String(200))

    environment: Mapped[Environment] = relationship(lazy="raise")
    phases: Mapped[list[Phase]] = relationship(
        back_populates="run", lazy="raise", order_by="Phase.id", cascade="all, delete-orphan"
    )
