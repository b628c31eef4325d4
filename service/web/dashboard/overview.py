"""The parity matrix: latest verdict per check × track, read from the history summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.verdict_names import FAILED, PASS, RUN_VERDICTS
from models import Environment, HistorySummary, Run
from service.core.checks import long_lived
from service.core.run_state import IN_FLIGHT, RunState
from service.core.verdicts import run_label
from service.selftest.batch import LABEL as SELFTEST_LABEL
from service.selftest.batch import detector_health

# detector-health runs fail on purpose: they have their own section, not cells of the matrix
NOT_SELFTEST = ~Run.labels.has_key(SELFTEST_LABEL)


@dataclass
class Cell:
    """The latest finished run of one check on one track, plus its history counts."""

    run_id: int
    check_key: str
    check_name: str
    config: str
    track: str
    environment: str
    build: str | None
    verdict: str
    regression: bool
    compared_track: str | None
    finished_at: datetime | None
    max_abs_loss_delta: float | None
    signatures: list[str]
    failing_since_run_id: int | None
    counts: dict[str, int] = field(default_factory=dict)
    known: list[dict] = field(default_factory=list)
    fixed_known: list[dict] = field(default_factory=list)
    worked_around_by: dict[str, list[str]] = field(default_factory=dict)
    suite_check: str | None = None  # the check's name in the suite that ran it (`suite_check` label)
    # what the label reads besides the columns above (service/core/verdicts.run_label)
    state: str | None = None
    summary: dict = field(default_factory=dict)
    first_divergent_step: int | None = None

    @property
    def shown(self) -> str:
        """The verdict as every page labels it: the run page's label (service/core/verdicts.run_label)."""
        return run_label(self)

    @property
    def hidden(self) -> list[str]:
        """'passes only with workaround X, which hides Y' lines for a worked-around pass."""
        return [f"passes only with workaround {w}, which hides {', '.join(sigs)}"
                for w, sigs in sorted(self.worked_around_by.items())] if self.verdict == PASS else []

    @property
    def bad(self) -> bool:
        """Whether the latest verdict is fail or error."""
        return self.verdict in FAILED

    @property
    def against(self) -> str | None:
        """The base track a regression was judged against, when not the cell's own track."""
        if self.regression and self.compared_track and self.compared_track != self.track:
            return self.compared_track
        return None


@dataclass
class Row:
    """One check: its key, readable name (the spec), config and a cell per track."""

    check_key: str
    check_name: str
    config: str
    cells: dict[str, Cell]

    @property
    def name(self) -> str:
        """What the check is called: its suite check name where a suite ran it, else its config."""
        return next((c.suite_check for c in self.cells.values() if c.suite_check), None) or self.config


@dataclass
class Matrix:
    """Rows are checks (worst first), columns are the long-lived tracks (main, release branches, environments);
    pull requests' tracks are counted here and listed as suite runs."""

    tracks: list[str]
    rows: list[Row]
    failing: list[Cell]
    totals: dict[str, int]
    in_flight: dict[str, int]
    health: dict[str, Any] | None = None
    pr_tracks: int = 0


def _build():  # type: ignore[no-untyped-def]
    # the Megatron-Core version the run's phases recorded (evaluation.record_packages), else the phase info
    return func.coalesce(
        Run.summary["packages"]["megatron_core"].astext,
        Run.summary["phases"]["train_and_save"]["info"]["megatron_core"].astext,
    ).label("build")


def latest_cells(session: Session) -> list[Cell]:
    """One cell per check × track, from history_summary (kept by a trigger on runs, alembic 0014).

    The summary has a row per check × track × verdict (count, latest run): the latest of those rows
    is the cell's run, their counts its history. Nothing here reads more than one run per cell, so
    the page costs the same with ten runs of history or a million.
    """
    s = HistorySummary
    latest = (
        select(s.check_key, s.track, s.latest_run_id)
        .distinct(s.check_key, s.track)
        .order_by(s.check_key, s.track, s.latest_finished_at.desc().nulls_last(), s.latest_run_id.desc())
        .subquery()
    )
    counts = (
        select(s.check_key, s.track,
               *(func.coalesce(func.sum(s.runs).filter(s.verdict == v), 0).label(f"n{i}")
                 for i, v in enumerate(RUN_VERDICTS)))
        .group_by(s.check_key, s.track)
        .subquery()
    )
    rows = session.execute(
        select(Run.id, Run.check_key, Run.check_name, Run.config, Run.track, Run.environment_id, Run.verdict,
               Run.regression, Run.compared_track, Run.finished_at, Run.max_abs_loss_delta, Run.signatures,
               Run.failing_since_run_id, _build(), Run.summary["known_failures"].label("known"),
               Run.summary["known_fixed"].label("fixed_known"),
               Run.summary["worked_around_by"].label("worked_around_by"), Run.summary, Run.state,
               Run.first_divergent_step,
               Run.labels["suite_check"].astext.label("suite_check"),
               Environment.name.label("environment"), *(counts.c[f"n{i}"] for i in range(len(RUN_VERDICTS))))
        .join(latest, latest.c.latest_run_id == Run.id)
        .join(Environment, Environment.id == Run.environment_id)
        .join(counts, (counts.c.check_key == latest.c.check_key) & (counts.c.track == latest.c.track))
    ).all()
    return [
        Cell(run_id=r.id, check_key=r.check_key, check_name=r.check_name, config=r.config, track=r.track,
             environment=r.environment, build=r.build, verdict=r.verdict, regression=r.regression,
             compared_track=r.compared_track, finished_at=r.finished_at, max_abs_loss_delta=r.max_abs_loss_delta,
             signatures=list(r.signatures or []), failing_since_run_id=r.failing_since_run_id,
             counts={v: getattr(r, f"n{i}") for i, v in enumerate(RUN_VERDICTS)},
             known=list(r.known or []), fixed_known=list(r.fixed_known or []),
             worked_around_by=dict(r.worked_around_by or {}), suite_check=r.suite_check, state=r.state,
             summary=dict(r.summary or {}), first_divergent_step=r.first_divergent_step)
        for r in rows
    ]


def in_flight_counts(session: Session) -> dict[str, int]:
    """How many runs are queued or running, by state (uses the state index)."""
    states = [RunState.QUEUED.value, RunState.EVALUATING.value, *(s.value for s in IN_FLIGHT)]
    rows = session.execute(
        select(Run.state, func.count()).where(Run.state.in_(states)).group_by(Run.state)
    ).all()
    return {state: count for state, count in rows}


def matrix(session: Session, *, long_lived_tracks: list[str] | None = None) -> Matrix:
    """Build the overview over the long-lived tracks (all when no patterns are given): regressions first,
    then other failures, then passing checks."""
    every = latest_cells(session)
    cells = every if long_lived_tracks is None else \
        [c for c in every if long_lived(c.track, c.environment, long_lived_tracks)]
    by_check: dict[str, Row] = {}
    for cell in cells:
        row = by_check.setdefault(cell.check_key, Row(cell.check_key, cell.check_name, cell.config, {}))
        row.cells[cell.track] = cell

    def badness(row: Row) -> tuple[int, int, str]:
        return (-sum(c.regression for c in row.cells.values()), -sum(c.bad for c in row.cells.values()),
                row.check_name)

    failing = sorted((c for c in cells if c.bad), key=lambda c: (not c.regression, c.check_name, c.track))
    totals: dict[str, int] = {v: sum(c.verdict == v for c in cells) for v in RUN_VERDICTS}
    totals["regression"] = sum(c.regression for c in cells)
    return Matrix(
        tracks=sorted({c.track for c in cells}),
        rows=sorted(by_check.values(), key=badness),
        failing=failing,
        totals=totals,
        in_flight=in_flight_counts(session),
        health=detector_health(session),
        pr_tracks=len({c.track for c in every} - {c.track for c in cells}),
    )
