"""A run's flow: the run, its phases, the state changes of both (and scheduler heartbeats), its per-step
metrics and its probes' findings."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from models.base import Base, CreatedAt, utcnow
from models.jsonsafe import SafeJSONB, SafeText

if TYPE_CHECKING:
    from models.environment import Environment


# A parity run: one validated spec, its state, its verdict, and its place in the history.
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
    error_message: Mapped[str | None] = mapped_column(SafeText)

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


# One launch of one phase of a run (train_and_save or resume); a retry is a new row.
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
    exit_reason: Mapped[str | None] = mapped_column(SafeText)
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


# Every state change of a run and of a phase, in order, with its reason; plus scheduler heartbeats.
class RunEvent(Base):
    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(SafeText, default="")
    at: Mapped[datetime] = mapped_column(default=utcnow)


class SchedulerHeartbeat(Base):
    __tablename__ = "scheduler_heartbeats"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    detail: Mapped[str] = mapped_column(SafeText, default="")


class PhaseEvent(Base):
    __tablename__ = "phase_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    phase_id: Mapped[int] = mapped_column(ForeignKey("phases.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(SafeText, default="")
    at: Mapped[datetime] = mapped_column(default=utcnow)


# Per-step metrics of the uninterrupted (baseline) and resumed runs, with their deltas.
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


# Evidence gathered by the job's probes: misaligned params, fingerprint differences, bucket offsets.
class ProbeFinding(Base):
    __tablename__ = "probe_findings"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    phase: Mapped[str] = mapped_column(String(32))
    probe: Mapped[str] = mapped_column(String(64))
    ok: Mapped[bool] = mapped_column(Boolean)
    param_name: Mapped[str | None] = mapped_column(String(500))
    detail: Mapped[dict[str, Any]] = mapped_column(SafeJSONB, default=dict)
