"""Config history: the worst |Δloss| and the verdicts of one config over time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.configs import CONFIGS
from jobs.verdict_names import VERDICTS
from models import Environment, Run
from service.web.dashboard.overview import NOT_SELFTEST
from service.web.dashboard.rendering import PageError
from service.web.dashboard.runpage import log_floor

LIMIT = 500


@dataclass
class Lane:
    """One check on one track of a config: its runs (oldest first) and verdict counts."""

    check_key: str
    check_name: str
    track: str
    rows: list[Any] = field(default_factory=list)

    @property
    def latest(self) -> Any:
        """The newest run of the lane."""
        return self.rows[-1]


def history(session: Session, config: str, environment: str | None = None, limit: int = LIMIT, *,
            check: str | None = None, track: str | None = None) -> dict[str, Any]:
    """A config's finished runs (oldest first) split by check × track, and the trend of one lane
    (the one asked for, else the one with the newest run): a trend never mixes checks or tracks."""
    query = (
        select(Run.id, Run.created_at, Run.finished_at, Run.verdict, Run.regression, Run.max_abs_loss_delta,
               Run.signatures, Run.labels, Environment.name.label("environment"),
               Run.summary["worked_around_by"].label("worked_around_by"), Run.check_key, Run.check_name, Run.track,
               # what the label reads (service/core/verdicts.run_label): the run page's words
               Run.summary, Run.state, Run.compared_track, Run.first_divergent_step)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.config == config, Run.verdict.is_not(None), NOT_SELFTEST)
        .order_by(Run.created_at.desc(), Run.id.desc())
        .limit(limit)
    )
    if environment:
        query = query.where(Environment.name == environment)
    all_rows = list(reversed(session.execute(query).all()))
    if not all_rows and config not in CONFIGS:
        raise PageError(404, f"config {config!r} is unknown and has no runs")
    lanes: dict[tuple[str, str], Lane] = {}
    for r in all_rows:
        lanes.setdefault((r.check_key, r.track), Lane(r.check_key, r.check_name, r.track)).rows.append(r)
    ordered = sorted(lanes.values(), key=lambda lane: (lane.check_name, lane.track))
    chosen = lanes.get((check or "", track or "")) if check and track else None
    if chosen is None and ordered:
        chosen = max(ordered, key=lambda lane: (lane.latest.finished_at or lane.latest.created_at, lane.latest.id))
    rows = chosen.rows if chosen else []
    deltas = [r.max_abs_loss_delta for r in rows]
    floor = log_floor(deltas)
    xs = [(r.finished_at or r.created_at).timestamp() for r in rows]
    worst = [None if d is None else (d or floor) for d in deltas]
    chart = {"x": xs, "worst": worst, "floor": floor, "ids": [r.id for r in rows]}
    for verdict in VERDICTS:
        chart[verdict] = [w if r.verdict == verdict else None for r, w in zip(rows, worst, strict=True)]
    return {
        "config": config,
        "known": config in CONFIGS,
        "description": getattr(CONFIGS.get(config), "description", ""),
        "environment": environment,
        "environments": sorted({r.environment for r in all_rows}),
        "rows": rows,
        "lanes": ordered,
        "lane": chosen,
        "recent": all_rows[::-1][:50],
        "chart": chart,
        "counts": {v: sum(r.verdict == v for r in rows) for v in VERDICTS},
    }
