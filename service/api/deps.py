"""Request dependencies: the session that owns the request's transaction, and token checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Path
from sqlalchemy.orm import Session

from models import ApiToken
from service.db import session_scope
from service.settings import Settings, get_settings
from service.tokens import authenticate


def get_session() -> Iterator[Session]:
    """One transaction per request: committed when the route returns, rolled back when it raises."""
    with session_scope() as session:
        yield session


# scope="function": the commit runs when the route returns, before the response is sent. With the
# default ("request") it ran after the response went out, so CI could be told 202 for a run that was
# never stored (or whose commit then failed) and an immediate GET of its Location could 404.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


# ids are Postgres integers: anything larger cannot name a row (and must not reach the database)
RunId = Annotated[int, Path(ge=1, le=2**31 - 1)]
RowId = RunId
SettingsDep = Annotated[Settings, Depends(get_settings)]


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def require_submit(session: SessionDep, authorization: Annotated[str | None, Header()] = None) -> ApiToken:
    """Writes need a token with the submit scope."""
    return authenticate(session, token=_bearer(authorization), scope="submit")


def require_admin(session: SessionDep, authorization: Annotated[str | None, Header()] = None) -> ApiToken:
    """Administrative writes need the admin scope."""
    return authenticate(session, token=_bearer(authorization), scope="admin")


def require_read(
    session: SessionDep, settings: SettingsDep, authorization: Annotated[str | None, Header()] = None
) -> ApiToken | None:
    """Reads are open unless PARITY_READS_REQUIRE_TOKEN is set."""
    if not settings.reads_require_token:
        return None
    return authenticate(session, token=_bearer(authorization), scope="read")


SubmitToken = Annotated[ApiToken, Depends(require_submit)]
AdminToken = Annotated[ApiToken, Depends(require_admin)]
ReadAccess = Annotated[ApiToken | None, Depends(require_read)]
