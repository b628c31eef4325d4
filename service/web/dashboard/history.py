"""Config history: the worst |Δloss| and the verdicts of one config over time."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.configs import CONFIGS
from jobs.contract import VERDICTS
from models import Environment, Run
from service.web.dashboard.rendering import PageError
from service.web.dashboard.runpage import log_floor

LIMIT = 500


def history(session: Session, config: str, environment: str | None = None, limit: int = LIMIT) -> dict[str, Any]:
    """The latest `limit` finished runs of a config (oldest first) and their chart series."""
    query = (
        select(Run.id, Run.created_at, Run.finished_at, Run.verdict, Run.regression, Run.max_abs_loss_delta,
               Run.signatures, Run.labels, Environment.name.label("environment"),
               Run.summary["worked_around_by"].label("worked_around_by"), Run.check_key, Run.check_name, Run.track)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.config == config, Run.verdict.is_not(None))
        .order_by(Run.created_at.desc(), Run.id.desc())
        .limit(limit)
    )
    if environment:
        query = query.where(Environment.name == environment)
    rows = list(reversed(session.execute(query).all()))
    if not rows and config not in CONFIGS:
        raise PageError(404, f"config {config!r} is unknown and has no runs")
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
        "environments": sorted({r.environment for r in rows}),
        "rows": rows,
        "recent": rows[::-1][:50],
        "chart": chart,
        "counts": {v: sum(r.verdict == v for r in rows) for v in VERDICTS},
    }
