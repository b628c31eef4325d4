"""Runs asked for together: suites and their suite runs, and bisects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt, utcnow
from models.jsonsafe import SafeText


# A suite: an admin-defined, named, versioned list of named checks (specs) a gate runs together.
#
# Applying a suite whose checks changed stores a new version; the old versions stay, so a suite run
# always names exactly what it ran.
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


# A suite run: every check of one suite version queued on one environment, answered as one verdict.
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


# A bisect: which environment of an ordered list first fails a check. Its steps are its runs.
#
# The row keeps only the question (the check's spec, the ordered environments) and the answer once
# known; each step is a run labelled `bisect=<id>` or a stored verdict of the same check on that
# environment, so the state is always derivable from the runs (service/bisects/search.py).
class Bisect(CreatedAt, Base):
    __tablename__ = "bisects"

    # 12 hex digits, like a sweep id: what the runs' `bisect` label carries
    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    check_key: Mapped[str] = mapped_column(String(16), index=True)
    check_name: Mapped[str] = mapped_column(String(500))
    # environment names, oldest (known good) first, known bad last
    environments: Mapped[list[str]] = mapped_column(JSONB)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, default=dict)
    requester: Mapped[str | None] = mapped_column(String(200))
    # running | found | error: a cache of what the runs say, rewritten on every advance
    state: Mapped[str] = mapped_column(String(16), default="running")
    first_bad: Mapped[str | None] = mapped_column(String(200))
    error_message: Mapped[str | None] = mapped_column(SafeText)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    # a bisect over a source's commits: its environments are built when a step needs them, named by
    # commit; `commits` holds [{"sha", "subject", "date"}] in the order of `environments`
    source: Mapped[str | None] = mapped_column(String(100))
    commits: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
