"""/api/v1/sources (admin registers where Megatron-LM's code comes from) and /api/v1/tracks (a suite run on
a source's latest commit, on a schedule or now; a bisect of a check that broke on it)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from service.bisects import search as bisects
from service.core.deps import AdminToken, ReadAccess, SessionDep, SettingsDep, SubmitToken
from service.core.links import BaseUrl
from service.core.schemas import ERROR_RESPONSES
from service.core.tracks import authorize_track
from service.environments import sources
from service.tracks import schedule

sources_router = APIRouter(prefix="/api/v1/sources", tags=["tracks"], responses=ERROR_RESPONSES)
router = APIRouter(prefix="/api/v1/tracks", tags=["tracks"], responses=ERROR_RESPONSES)
TrackName = Annotated[str, Path(pattern=schedule.NAME.pattern)]


class SourceIn(BaseModel):
    """POST /sources: a git URL or local repository with a ref (branch, tag, commit), or a local tree (no ref)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=100)
    location: str = Field(max_length=1000, description="https://…, ssh://…, file://…, git@…, or an absolute path")
    ref: str | None = Field(default=None, max_length=200,
                            description="branch, tag or commit (a URL without one: main); none: a plain tree")


class TrackIn(BaseModel):
    """POST /tracks: run `suite` on `source`'s latest commit every `every` (and on demand)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=100)
    source: str = Field(max_length=100)
    suite: str = Field(max_length=100)
    every: str = Field(default="24h", max_length=20, description="30m, 24h, 7d …")
    auto_bisect: bool = Field(default=False, description="bisect the commits when a check goes pass -> fail")


class TrackBisectIn(BaseModel):
    """POST /tracks/{name}/bisect: the commits between the check's last pass and first failure on the track."""

    model_config = ConfigDict(extra="forbid")

    check: str = Field(pattern=r"^[0-9a-f]{16}$")


@sources_router.post("", status_code=201)
def add_source(body: SourceIn, session: SessionDep, token: AdminToken) -> dict[str, Any]:
    """Register a source (admin): git reads it when a track or bisect first resolves it."""
    source = sources.register_source(session, name=body.name, location=body.location, ref=body.ref,
                                     created_by=token.name)
    return sources.source_doc(source)


@sources_router.get("")
def list_sources(session: SessionDep, _: ReadAccess) -> list[dict[str, Any]]:
    """Every source."""
    return [sources.source_doc(s) for s in sources.list_sources(session)]


@router.post("", status_code=201)
def add_track(body: TrackIn, session: SessionDep, token: AdminToken) -> dict[str, Any]:
    """Define a track (admin); the scheduler runs it at once, then every `every`."""
    track = schedule.add_track(session, name=body.name, source=body.source, suite=body.suite, every=body.every,
                               auto_bisect=body.auto_bisect, created_by=token.name)
    return schedule.track_doc(session, track)


@router.get("")
def list_tracks(session: SessionDep, _: ReadAccess) -> list[dict[str, Any]]:
    """Every track with its last run and commit."""
    return [schedule.track_doc(session, t) for t in schedule.list_tracks(session)]


@router.get("/{name}")
def track(name: TrackName, session: SessionDep, _: ReadAccess) -> dict[str, Any]:
    """One track."""
    return schedule.track_doc(session, schedule.get_track(session, name))


@router.post("/{name}/run", status_code=202)
def run_track(name: TrackName, session: SessionDep, token: SubmitToken) -> dict[str, Any]:
    """Make the track due now: the scheduler queues its suite on the source's latest commit."""
    authorize_track(token, labels={"branch": name}, environment="")  # its runs write track `name`
    return schedule.track_doc(session, schedule.request_run(session, name))


@router.post("/{name}/bisect", status_code=202)
def bisect_track(name: TrackName, body: TrackBisectIn, session: SessionDep, settings: SettingsDep,
                 token: SubmitToken, base: BaseUrl) -> dict[str, Any]:
    """Bisect the commits between the check's last pass and its first failure on the track."""
    authorize_track(token, labels={"branch": name}, environment="")  # the track's owner (or an admin) asks
    row = schedule.bisect_check(session, track_name=name, check=body.check, settings=settings,
                                requester=token.name)
    return bisects.describe(session, row, base)
