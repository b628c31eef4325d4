"""/api/v1/artifacts: upload a wheel or sdist (streamed, its own size limit), then build from `artifact:<sha256>`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict

from models import Artifact
from service.artifacts import store
from service.core.deps import ReadAccess, SessionDep, SettingsDep, _bearer
from service.core.schemas import ERROR_RESPONSES
from service.core.tokens import authenticate

router = APIRouter(prefix="/api/v1/artifacts", tags=["artifacts"], responses=ERROR_RESPONSES)
Sha256 = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")]


class ArtifactOut(BaseModel):
    """An uploaded build; `requirement` is the line that builds an environment from it."""

    model_config = ConfigDict(from_attributes=True)

    sha256: str
    filename: str
    kind: str
    size_bytes: int
    state: str
    uploaded_by: str | None
    created_at: datetime
    last_used_at: datetime | None
    requirement: str


def _out(art: Artifact) -> ArtifactOut:
    return ArtifactOut.model_validate({**{k: getattr(art, k) for k in ArtifactOut.model_fields if k != "requirement"},
                                       "requirement": f"artifact:{art.sha256}"})


@router.post("", status_code=201, response_model=ArtifactOut, openapi_extra={
    "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {
        "type": "string", "format": "binary"}}}},
}, responses={200: {"model": ArtifactOut, "description": "The same bytes were already uploaded: that artifact"},
              413: {"description": "Larger than PARITY_ARTIFACT_MAX_BYTES"},
              429: {"description": "The token's artifact quota (PARITY_TOKEN_MAX_ARTIFACTS, "
                                   "PARITY_TOKEN_MAX_ARTIFACT_BYTES) is used up"}})
async def upload(
    request: Request, session: SessionDep, settings: SettingsDep, response: Response,
    filename: Annotated[str, Query(max_length=255, description="the file's name (a wheel's name carries its tags)")],
    authorization: Annotated[str | None, Header()] = None,
) -> ArtifactOut:
    """Store the body (a wheel or sdist) under its SHA-256 (submit token); the same bytes are stored once."""
    # the token, the name and the token's quota are checked before a byte of the body is read (the app-wide
    # input check leaves a streamed body alone: service/core/limits.py)
    token = await run_in_threadpool(authenticate, session, token=_bearer(authorization), scope="submit")
    store.check_filename(filename)
    allowed = await run_in_threadpool(store.allowance, session, token=token, settings=settings)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > allowed.limit:
        raise allowed.refusal  # a declared length past what is left: refused before the body
    writer = store.Writer(store.incoming(settings), allowed)
    try:
        async for chunk in request.stream():
            writer.write(chunk)
    except BaseException:
        writer.discard()
        raise
    received = writer.finish()
    art, new = await run_in_threadpool(
        store.store, session, received=received, filename=filename, token=token, settings=settings)
    if not new:
        response.status_code = 200
    return _out(art)


@router.get("", response_model=list[ArtifactOut])
def artifacts(session: SessionDep, authorization: Annotated[str | None, Header()] = None,
              limit: Annotated[int, Query(ge=1, le=500)] = 100) -> list[ArtifactOut]:
    """The newest artifacts this token uploaded (admin: every one); a token is needed whatever
    PARITY_READS_REQUIRE_TOKEN says: a listing of every tenant's wheels tells who tests what, unreleased."""
    token = authenticate(session, token=_bearer(authorization), scope=None)  # whoever uploads may list theirs
    owner = None if "admin" in token.scopes else token.id
    return [_out(a) for a in store.list_artifacts(session, limit=limit, token_id=owner)]


@router.get("/{sha256}", response_model=ArtifactOut)
def artifact(sha256: Sha256, session: SessionDep, _: ReadAccess) -> ArtifactOut:
    """One uploaded artifact."""
    return _out(store.get_artifact(session, sha256=sha256))
