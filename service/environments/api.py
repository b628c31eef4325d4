"""/api/v1/environments: register a prepared Python, or have the service build one from requirement lines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Response
from fastapi.responses import PlainTextResponse

from service.core.deps import ReadAccess, SessionDep, SettingsDep, _bearer
from service.core.errors import NotFound
from service.core.folder_files import UnsafeFile, read_tail
from service.core.schemas import ERROR_RESPONSES, EnvironmentIn, EnvironmentOut
from service.core.tokens import authenticate
from service.environments.build_policy import authorize_build
from service.environments.registry import (
    InvalidEnvironment,
    create_environment,
    ensure_default_environment,
    get_environment,
    inspect_python,
    list_environments,
    request_build,
)
from service.environments.requirements import RequirementError, normalize

router = APIRouter(prefix="/api/v1/environments", tags=["environments"], responses=ERROR_RESPONSES)
LOG_TAIL_BYTES = 256 * 1024


@router.get("", response_model=list[EnvironmentOut])
def environments(session: SessionDep, settings: SettingsDep, _: ReadAccess) -> list[EnvironmentOut]:
    """Every environment, registered or built (the default one is created on first use)."""
    ensure_default_environment(session, settings=settings)
    return [EnvironmentOut.model_validate(e) for e in list_environments(session)]


@router.post("", status_code=201, response_model=EnvironmentOut, responses={
    200: {"model": EnvironmentOut, "description": "An identical requirement set is already built: that environment"},
})
def add_environment(
    body: EnvironmentIn, session: SessionDep, settings: SettingsDep, response: Response,
    authorization: Annotated[str | None, Header()] = None,
) -> EnvironmentOut:
    """Register `python` (admin; checked to import torch and megatron.core), or build `requirements`.

    A build with the same requirement set (by content) is reused: 200 with the existing one.
    """
    if body.python is not None:
        authenticate(session, token=_bearer(authorization), scope="admin")
        assert body.name is not None  # the schema requires it with python
        versions = inspect_python(body.python)
        env = create_environment(
            session, name=body.name, python=body.python, description=body.description, packages=versions
        )
        return EnvironmentOut.model_validate(env)
    token = authenticate(session, token=_bearer(authorization), scope="submit")
    assert body.requirements is not None
    try:
        normalize(body.requirements)
    except RequirementError as exc:
        raise InvalidEnvironment(str(exc), field=exc.field) from None
    # a build runs the install code of every line it names: who may name what is decided here
    # (indexed as the client sent them, not as normalize sorts them)
    authorize_build([line.strip() for line in body.requirements], list(token.scopes), settings)
    env, created = request_build(
        session, requirements=body.requirements, settings=settings, name=body.name, description=body.description,
        token=token,
    )
    if not created:
        response.status_code = 200
    return EnvironmentOut.model_validate(env)


@router.get("/{name}", response_model=EnvironmentOut)
def environment(name: str, session: SessionDep, _: ReadAccess) -> EnvironmentOut:
    """One environment: its state, packages (`pip freeze` of a build) and build error if any."""
    return EnvironmentOut.model_validate(get_environment(session, name=name))


@router.get("/{name}/log", responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                           "description": "The tail of the build log"}})
def build_log(name: str, session: SessionDep, _: ReadAccess) -> PlainTextResponse:
    """The tail of a built environment's build log (pip's output)."""
    env = get_environment(session, name=name)
    if not env.folder:
        raise NotFound(f"name: environment {name!r} has no build log", field="name")
    try:
        # the build wrote this file: never through a symlink, never outside its folder, never unbounded
        data = read_tail(Path(env.folder), "build.log", LOG_TAIL_BYTES)
    except UnsafeFile as exc:
        raise NotFound(f"name: environment {name!r} has no readable build log ({exc})", field="name") from None
    return PlainTextResponse(data.decode(errors="replace"))
