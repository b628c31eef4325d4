"""The parity matrix: latest verdict per config × environment, computed in SQL."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.contract import VERDICTS
from models import Environment, Run
from service.selftest import detector_health
from service.state import IN_FLIGHT, RunState

BAD = ("fail", "error")


@dataclass
class Cell:
    """The latest finished run of one config on one environment, plus its history counts."""

    run_id: int
    config: str
    environment: str
    verdict: str
    regression: bool
    finished_at: datetime | None
    max_abs_loss_delta: float | None
    signatures: list[str]
    failing_since_run_id: int | None
    counts: dict[str, int] = field(default_factory=dict)
    label: str | None = None  # "pass (worked around)" where a workaround hid a finding
    worked_around_by: dict[str, list[str]] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        """The verdict as the matrix shows it."""
        return self.label or self.verdict

    @property
    def hidden(self) -> list[str]:
        """'passes only with workaround X, which hides Y' lines for a worked-around pass."""
        return [f"passes only with workaround {w}, which hides {', '.join(sigs)}"
                for w, sigs in sorted(self.worked_around_by.items())] if self.verdict == "pass" else []

    @property
    def bad(self) -> bool:
        """Whether the latest verdict is fail or error."""
        return self.verdict in BAD


@dataclass
class Matrix:
    """Rows are configs (worst first), columns are environments."""

    environments: list[str]
    rows: list[tuple[str, dict[str, Cell]]]
    failing: list[Cell]
    totals: dict[str, int]
    in_flight: dict[str, int]
    health: dict[str, Any] | None = None


def latest_cells(session: Session) -> list[Cell]:
    """One cell per config × environment: DISTINCT ON picks the latest verdict without a Python scan."""
    latest = (
        select(Run.id, Run.config, Run.environment_id, Run.verdict, Run.regression, Run.finished_at,
               Run.max_abs_loss_delta, Run.signatures, Run.failing_since_run_id,
               Run.summary["verdict_label"].astext.label("label"),
               Run.summary["worked_around_by"].label("worked_around_by"))
        .where(Run.verdict.is_not(None))
        .distinct(Run.config, Run.environment_id)
        .order_by(Run.config, Run.environment_id, Run.finished_at.desc().nulls_last(), Run.id.desc())
        .subquery()
    )
    counts = (
        select(
            Run.config, Run.environment_id,
            func.count().filter(Run.verdict == "pass").label("n_pass"),
            func.count().filter(Run.verdict == "fail").label("n_fail"),
            func.count().filter(Run.verdict == "error").label("n_error"),
        )
        .where(Run.verdict.is_not(None))
        .group_by(Run.config, Run.environment_id)
        .subquery()
    )
    rows = session.execute(
        select(latest, Environment.name, counts.c.n_pass, counts.c.n_fail, counts.c.n_error)
        .join(Environment, Environment.id == latest.c.environment_id)
        .join(counts, (counts.c.config == latest.c.config) & (counts.c.environment_id == latest.c.environment_id))
    ).all()
    return [
        Cell(run_id=r.id, config=r.config, environment=r.name, verdict=r.verdict, regression=r.regression,
             finished_at=r.finished_at, max_abs_loss_delta=r.max_abs_loss_delta, signatures=list(r.signatures or []),
             failing_since_run_id=r.failing_since_run_id, label=r.label,
             worked_around_by=dict(r.worked_around_by or {}),
             counts={"pass": r.n_pass, "fail": r.n_fail, "error": r.n_error})
        for r in rows
    ]


def in_flight_counts(session: Session) -> dict[str, int]:
    """How many runs are queued or running, by state (uses the state index)."""
    states = [RunState.QUEUED.value, RunState.EVALUATING.value, *(s.value for s in IN_FLIGHT)]
    rows = session.execute(
        select(Run.state, func.count()).where(Run.state.in_(states)).group_by(Run.state)
    ).all()
    return {state: count for state, count in rows}


def matrix(session: Session) -> Matrix:
    """Build the overview: regressions first, then other failures, then passing configs."""
    cells = latest_cells(session)
    by_config: dict[str, dict[str, Cell]] = {}
    for cell in cells:
        by_config.setdefault(cell.config, {})[cell.environment] = cell

    def badness(item: tuple[str, dict[str, Cell]]) -> tuple[int, int, str]:
        row = item[1].values()
        return (-sum(c.regression for c in row), -sum(c.bad for c in row), item[0])

    failing = sorted((c for c in cells if c.bad), key=lambda c: (not c.regression, c.config, c.environment))
    totals: dict[str, int] = {v: sum(c.verdict == v for c in cells) for v in VERDICTS}
    totals["regression"] = sum(c.regression for c in cells)
    return Matrix(
        environments=sorted({c.environment for c in cells}),
        rows=sorted(by_config.items(), key=badness),
        failing=failing,
        totals=totals,
        in_flight=in_flight_counts(session),
        health=detector_health(session),
    )
