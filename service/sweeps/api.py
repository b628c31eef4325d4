"""/api/v1/sweeps: configs × environments × spec variations in one call, and the grid as it fills."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from service.core.deps import ReadAccess, SessionDep, SettingsDep, SubmitToken
from service.core.limits import MAX_LABELS
from service.core.links import BaseUrl, sweep_urls
from service.core.schemas import ERROR_RESPONSES, ClientLabels
from service.core.tracks import authorize_track
from service.runs.api import caps
from service.sweeps import grid as sweeps

router = APIRouter(prefix="/api/v1/sweeps", tags=["sweeps"], responses=ERROR_RESPONSES)
SweepId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]


class SweepCreate(BaseModel):
    """POST /sweeps: every config × environment × variation becomes one run of base + variation."""

    model_config = ConfigDict(extra="forbid")

    configs: list[Annotated[str, Field(max_length=100)]] = Field(min_length=1, max_length=50)
    environments: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=lambda: ["default"], min_length=1, max_length=50)
    variations: list[dict[str, Any]] = Field(
        default_factory=list, max_length=50,
        description="Spec overrides, one per row (e.g. {'sharding': 'fully_sharded_model_space'})",
    )
    base: dict[str, Any] = Field(
        default_factory=lambda: {"dp": 2, "steps": 6, "save_step": 3},
        description="Spec fields shared by every run (config comes from `configs`)",
    )
    labels: ClientLabels = Field(default_factory=dict, max_length=MAX_LABELS - 2)


@router.post("", status_code=202)
def create_sweep(
    body: SweepCreate, session: SessionDep, settings: SettingsDep, token: SubmitToken, base: BaseUrl,
) -> dict[str, Any]:
    """Queue every run of the sweep; the answer is its grid (every cell queued)."""
    for environment in body.environments:
        authorize_track(token, labels=body.labels, environment=environment)
    sweep_id, _ = sweeps.create_sweep(
        session, configs=body.configs, environments=body.environments, variations=body.variations,
        base=body.base, labels=body.labels, requester=token.name, settings=settings, caps=caps(settings),
        token_id=token.id,
    )
    session.flush()
    grid = sweeps.sweep_grid(session, sweep_id=sweep_id)
    grid["links"] = sweep_urls(base, sweep_id)
    return grid


@router.get("/{sweep_id}")
def sweep(sweep_id: SweepId, session: SessionDep, _: ReadAccess) -> dict[str, Any]:
    """The sweep's grid: rows environment × variation, columns configs, each cell a run's state and verdict."""
    return sweeps.sweep_grid(session, sweep_id=sweep_id)
