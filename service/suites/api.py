"""/api/v1/suites (admin defines named, versioned check lists) and /api/v1/suite-runs (queue one on a build)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator

from service.core.deps import AdminToken, ReadAccess, SessionDep, SettingsDep, SubmitToken
from service.core.errors import InvalidSpec
from service.core.limits import MAX_LABELS
from service.core.links import BaseUrl
from service.core.schemas import ERROR_RESPONSES, ClientLabels
from service.core.tracks import authorize_track
from service.runs import changes
from service.runs.api import MAX_WAIT_S, caps, database_url
from service.suites import definitions, runs
from service.suites.schemas import SuiteRunOut, SuiteRunPage

router = APIRouter(prefix="/api/v1/suites", tags=["suites"], responses=ERROR_RESPONSES)
runs_router = APIRouter(prefix="/api/v1/suite-runs", tags=["suites"], responses=ERROR_RESPONSES)
SuiteName = Annotated[str, Path(pattern=definitions.NAME.pattern)]
MAX_VERSION = 2**31 - 1  # a Postgres integer: a larger one cannot name a row (and must not reach the database)
SuiteRunId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]


class SuiteIn(BaseModel):
    """POST /suites: the whole suite; changed checks make a new version, the same ones keep the current."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=100)
    description: str = Field(default="", max_length=2000)
    checks: list[definitions.SuiteCheck] = Field(
        min_length=1, max_length=definitions.MAX_CHECKS,
        description="[{name, spec, why?}]: a readable check name and the run spec it stands for")

    @field_validator("checks", mode="wrap")
    @classmethod
    def _name_the_check(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except InvalidSpec as exc:  # a spec's own error (the CheckSpec raises it): say which check
            raise definitions.locate_spec_error(value, exc) from None


class SuiteRunIn(BaseModel):
    """POST /suite-runs: queue every check of the suite (newest version unless given) on one environment."""

    model_config = ConfigDict(extra="forbid")

    suite: str = Field(max_length=100)
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION)
    environment: str = Field(default="default", max_length=200)
    labels: ClientLabels = Field(default_factory=dict, max_length=MAX_LABELS - 3)


@router.post("", status_code=201, responses={200: {"description": "Unchanged: the current version"}})
def apply(body: SuiteIn, session: SessionDep, token: AdminToken, response: Response) -> dict[str, Any]:
    """Define or update a suite (admin)."""
    suite, new = definitions.apply_suite(session, name=body.name, checks=body.checks, description=body.description,
                                         created_by=token.name)
    if not new:
        response.status_code = 200
    return definitions.suite_doc(suite)


@router.get("")
def suites(session: SessionDep, _: ReadAccess) -> list[dict[str, Any]]:
    """The newest version of every suite."""
    return [definitions.suite_doc(s) for s in definitions.list_suites(session)]


@router.get("/{name}")
def suite(name: SuiteName, session: SessionDep, _: ReadAccess,
          version: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None) -> dict[str, Any]:
    """One suite (its newest version unless `version` is given)."""
    return definitions.suite_doc(definitions.get_suite(session, name=name, version=version))


@runs_router.post("", status_code=202, response_model=SuiteRunOut)
def create_suite_run(
    body: SuiteRunIn, session: SessionDep, settings: SettingsDep, base: BaseUrl, token: SubmitToken,
    response: Response, idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    """Queue every check of the suite on the environment as one suite run (a repeated Idempotency-Key: that one)."""
    authorize_track(token, labels=body.labels, environment=body.environment)
    suite_run, created = runs.create_suite_run(
        session, suite_name=body.suite, version=body.version, environment=body.environment, labels=body.labels,
        requester=token.name, settings=settings, caps=caps(settings), token_id=token.id,
        idempotency_key=idempotency_key)
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return runs.suite_run_view(session, suite_run_id=suite_run.id, base=base)


@runs_router.get("", response_model=SuiteRunPage)
def suite_run_list(
    session: SessionDep, settings: SettingsDep, base: BaseUrl, _: ReadAccess,
    branch: Annotated[str | None, Query(max_length=200, description="only suite runs with this branch label")] = None,
    suite: Annotated[str | None, Query(max_length=100, pattern=definitions.NAME.pattern,
                                       description="only runs of this suite")] = None,
    prs: Annotated[bool, Query(description="only pull requests': a branch PARITY_LONG_LIVED_TRACKS does not name")]
    = False,
    page: Annotated[int, Query(ge=1, le=10**6)] = 1,
    page_size: Annotated[int, Query(ge=1, le=200)] = runs.PAGE_SIZE,
) -> dict[str, Any]:
    """Suite runs, latest first, a page at a time; filter by branch label, suite, pull requests only."""
    return runs.suite_run_list(session, page=page, page_size=page_size, branch=branch, suite=suite, base=base,
                               prs_only=settings.long_lived_tracks if prs else None)


@runs_router.get("/{suite_run_id}", response_model=SuiteRunOut)
def suite_run(suite_run_id: SuiteRunId, session: SessionDep, base: BaseUrl, _: ReadAccess) -> dict[str, Any]:
    """A suite run: each check's run and outcome, and the overall verdict once every check ended."""
    return runs.suite_run_view(session, suite_run_id=suite_run_id, base=base)


def _view_released(session: SessionDep, suite_run_id: str, base: str) -> dict[str, Any]:
    # the read ends its transaction at once: a waiting request holds no pooled connection
    try:
        return runs.suite_run_view(session, suite_run_id=suite_run_id, base=base)
    finally:
        session.rollback()


@runs_router.get("/{suite_run_id}/wait", response_model=SuiteRunOut)
async def wait_for_suite_run(
    suite_run_id: SuiteRunId, session: SessionDep, base: BaseUrl, _: ReadAccess,
    after: Annotated[int, Query(ge=0, description="the suite run's `changes` the caller last saw")],
    timeout_s: Annotated[float, Query(gt=0, le=MAX_WAIT_S, description="the longest wait")] = MAX_WAIT_S,
) -> dict[str, Any]:
    """The suite run once any of its runs changed past `after` (or it finished), else as it is after timeout_s."""
    view = await run_in_threadpool(_view_released, session, suite_run_id, base)
    if view["changes"] > after or view["state"] == "finished":
        return view
    listening = await changes.listener(await database_url())
    with listening.watch([c["run"]["id"] for c in view["checks"]]) as waiter:
        view = await run_in_threadpool(_view_released, session, suite_run_id, base)  # registered: read again
        if view["changes"] <= after and view["state"] != "finished":
            await waiter.wait(timeout_s)
            view = await run_in_threadpool(_view_released, session, suite_run_id, base)
    return view
