"""Sweeps: every run of configs × environments × spec variations, created at once; read back as a grid.

A sweep is its runs: each carries the label `sweep=<id>` (the runs' GIN-indexed labels find them),
so there is no second record to keep consistent with the runs. Every cell is validated before any
run is written, so a bad cell queues nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from models import Run
from service.core.check_spec import run_spec_of
from service.core.errors import InvalidSpec, NotFound
from service.core.settings import Settings
from service.core.verdicts import run_label
from service.environments.registry import (
    DEFAULT_ENVIRONMENT,
    ensure_default_environment,
    get_environment,
    use_environment,
)
from service.runs.admission import Caps
from service.runs.records import create_run

SWEEP_LABEL = "sweep"
MAX_RUNS = 200


def _key(variation: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(variation.items())) or "base"


def create_sweep(
    session: Session, *, configs: list[str], environments: list[str], variations: list[dict[str, Any]],
    base: dict[str, Any], labels: dict[str, str], requester: str | None, settings: Settings,
    caps: Caps | None = None, token_id: int | None = None,
) -> tuple[str, list[Run]]:
    """Queue every config × environment × variation run (base spec + variation); return (id, runs)."""
    variations = variations or [{}]
    total = len(configs) * len(environments) * len(variations)
    if total > MAX_RUNS:
        raise InvalidSpec(f"sweep: {total} runs is more than {MAX_RUNS}", field="configs")
    envs = [
        ensure_default_environment(session, settings=settings) if name == DEFAULT_ENVIRONMENT
        else get_environment(session, name=name)
        for name in environments
    ]
    specs = []
    for v, variation in enumerate(variations):
        for config in configs:
            try:
                specs.append((run_spec_of({**base, **variation, "config": config}), variation))
            except InvalidSpec as exc:
                raise InvalidSpec(f"variations[{v}] with config {config!r}: {exc.detail}", field=exc.field) from None
    sweep_id = uuid.uuid4().hex[:12]
    runs = []
    for env in envs:
        use_environment(env)
        for spec, variation in specs:
            try:
                run, _ = create_run(
                    session, spec=spec, environment=env, requester=requester, token_id=token_id,
                    labels={**labels, SWEEP_LABEL: sweep_id, "variation": _key(variation)[:500]}, caps=caps,
                )
            except InvalidSpec as exc:  # a cuda cell this executor cannot give its GPUs: named, nothing queued
                raise InvalidSpec(f"variation {_key(variation)!r} with config {spec.config!r}: {exc.detail}",
                                  field=exc.field) from None
            runs.append(run)
    return sweep_id, runs


def sweep_grid(session: Session, *, sweep_id: str) -> dict[str, Any]:
    """The sweep as a grid: one row per environment × variation, one column per config."""
    runs = list(session.scalars(
        select(Run).where(Run.labels.contains({SWEEP_LABEL: sweep_id})).order_by(Run.id)
        .options(selectinload(Run.environment))
    ))
    if not runs:
        raise NotFound(f"sweep: unknown sweep {sweep_id!r}", field="sweep")
    configs = list(dict.fromkeys(r.config for r in runs))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in runs:
        row = rows.setdefault((r.environment.name, r.labels.get("variation", "base")), {
            "environment": r.environment.name, "megatron_core": r.environment.megatron_core,
            "variation": r.labels.get("variation", "base"), "cells": {},
        })
        row["cells"][r.config] = {
            "run_id": r.id, "state": r.state, "verdict": r.verdict, "label": run_label(r),
            "signatures": list(r.signatures or []),
            "error_message": (r.error_message or "")[:300] or None,
        }
    finished = sum(1 for r in runs if r.finished_at is not None)
    return {"id": sweep_id, "configs": configs, "rows": list(rows.values()), "runs": len(runs), "finished": finished}
