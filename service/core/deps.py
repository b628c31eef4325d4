"""Request dependencies: the session that owns the request's transaction, and token checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Path
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from models import ApiToken
from service.core.db import end_session, new_session
from service.core.settings import Settings, get_settings
from service.core.tokens import authenticate


async def get_session() -> AsyncIterator[Session]:
    """One transaction per request: committed when the route returns, rolled back when it raises.

    Async on purpose: a sync dependency costs a trip through the threadpool each way, and under
    load each trip waits for the GIL. Opening a session does no I/O (a connection is checked out at
    its first statement), so it happens on the event loop; the commit, which talks to Postgres,
    runs in the threadpool.
    """
    session = new_session()
    try:
        yield session
    except BaseException:
        await _end(session, commit=False)
        raise
    await _end(session, commit=True)


async def _end(session: Session, *, commit: bool) -> None:
    if not session.in_transaction():
        # nothing began (a request refused before its first statement): no round trip to make, so
        # no threadpool trip either; closing an idle session does no I/O
        session.close()
        return
    await run_in_threadpool(end_session, session, commit=commit)


def _read_token(session: Session, config: Settings, authorization: str | None) -> ApiToken | None:
    if not config.reads_require_token:
        return None
    return authenticate(session, token=_bearer(authorization), scope="read")


async def settings() -> Settings:
    """The service settings (cached; no I/O, so no threadpool trip)."""
    return get_settings()


# scope="function": the commit runs when the route returns, before the response is sent. With the
# default ("request") it ran after the response went out, so CI could be told 202 for a run that was
# never stored (or whose commit then failed) and an immediate GET of its Location could 404.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


# ids are Postgres integers: anything larger cannot name a row (and must not reach the database)
RunId = Annotated[int, Path(ge=1, le=2**31 - 1)]
RowId = RunId
SettingsDep = Annotated[Settings, Depends(settings)]


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


async def require_read(
    session: SessionDep, config: SettingsDep, authorization: Annotated[str | None, Header()] = None
) -> ApiToken | None:
    """Reads are open unless PARITY_READS_REQUIRE_TOKEN is set (then the token check runs in the threadpool)."""
    if not config.reads_require_token:
        return None  # no threadpool trip when there is nothing to check
    return await run_in_threadpool(_read_token, session, config, authorization)


SubmitToken = Annotated[ApiToken, Depends(require_submit)]
AdminToken = Annotated[ApiToken, Depends(require_admin)]
ReadAccess = Annotated[ApiToken | None, Depends(require_read)]
