"""/api/v1/bisects: the first environment of an ordered list on which a check fails.

The scheduler advances a bisect from the stored verdicts (queuing the next run when one is needed);
a GET only reads it, so polling (`parity bisect --wait`) never writes. A step is queued once.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.bisects import search as bisects
from service.core.check_spec import CheckSpec, run_spec_of
from service.core.deps import ReadAccess, SessionDep, SettingsDep, SubmitToken
from service.core.limits import MAX_LABELS
from service.core.links import BaseUrl
from service.core.schemas import ERROR_RESPONSES, ClientLabels
from service.core.tracks import authorize_track
from service.runs.api import caps

router = APIRouter(prefix="/api/v1/bisects", tags=["bisects"], responses=ERROR_RESPONSES)
BisectId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]
EnvName = Annotated[str, Field(min_length=1, max_length=200)]


class BisectCreate(BaseModel):
    """POST /bisects: a check (a spec, or the key of a stored check) and environments, good first, bad last."""

    model_config = ConfigDict(extra="forbid")

    spec: CheckSpec | None = Field(default=None, description="The check's run spec (as POST /runs takes)")
    check: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$",
                              description="Or the key of a stored check: its latest run's spec")
    good: EnvName = Field(description="An environment where the check passes (oldest)")
    bad: EnvName = Field(description="An environment where it fails (newest)")
    between: list[EnvName] = Field(default_factory=list, max_length=bisects.MAX_ENVIRONMENTS - 2,
                                   description="The environments in between, in order")
    labels: ClientLabels = Field(default_factory=dict, max_length=MAX_LABELS - 1)

    @model_validator(mode="after")
    def _one_check(self) -> BisectCreate:
        if (self.spec is None) == (self.check is None):
            raise ValueError("give exactly one of spec and check")
        return self


@router.post("", status_code=202)
def create_bisect(
    body: BisectCreate, session: SessionDep, settings: SettingsDep, token: SubmitToken, base: BaseUrl,
) -> dict[str, Any]:
    """Start the bisect: its first step reuses a stored verdict or queues a run."""
    for environment in (body.good, *body.between, body.bad):  # the scheduler queues its runs later, as this token
        authorize_track(token, labels=body.labels, environment=environment)
    # a check key: its latest run's stored spec, parsed here; a spec was parsed with the body
    spec = body.spec.run_spec if body.spec else run_spec_of(bisects.spec_of_check(session, body.check or ""))
    admission = caps(settings)
    if admission.gpus is not None:  # its runs are queued later, by the scheduler: a cuda check is refused now
        admission.gpus.check(spec)
    row = bisects.create_bisect(
        session, spec=spec, environments=[body.good, *body.between, body.bad], labels=body.labels,
        requester=token.name, settings=settings, caps=admission,
    )
    return bisects.describe(session, row, base)


@router.get("/{bisect_id}")
def bisect(bisect_id: BisectId, session: SessionDep, _: ReadAccess, base: BaseUrl) -> dict[str, Any]:
    """The bisect as the scheduler last advanced it: each environment's run, the first bad one.

    Reads only: the scheduler's pass moves every running bisect on (and a GET that wrote let any
    reader, anonymous ones included, queue runs and take row locks).
    """
    return bisects.describe(session, bisects.get_bisect(session, bisect_id), base)
