"""Request dependencies: the session that owns the request's transaction, and token checks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from models import ApiToken
from service.core.db import end_session, new_session
from service.core.settings import Settings, get_settings
from service.core.tokens import SeenToken, authenticate, recall


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
        # nothing began (a read served on the event loop, a refused request): no round trip to make, so
        # no threadpool trip either; closing an idle session does no I/O
        session.close()
        return
    await run_in_threadpool(end_session, session, commit=commit)


@contextmanager
def request_session(request: Request) -> Iterator[Session]:
    """A session for a route that declares no SessionDep and opens one only on its slow path.

    Such a route (GET /runs/{id}, what CI polls) skips FastAPI's dependency resolution, about a
    third of its CPU; it still honours an override of get_session (tests: a session bound to the
    test's outer transaction) as the dependency would. Read-only: nothing is committed.
    """
    override = request.app.dependency_overrides.get(get_session)
    if override is not None:
        given = override()
        try:
            yield next(given)
        finally:
            given.close()
        return
    session = new_session()
    try:
        yield session
    finally:
        end_session(session, commit=False)


def session_overridden(request: Request) -> bool:
    """True when a test replaced get_session (its session, not the event loop's pool, must serve reads)."""
    return get_session in request.app.dependency_overrides


def check_read(session: Session, request: Request) -> ApiToken | None:
    """require_read for a route without dependencies (sync: call it in the threadpool)."""
    return _read_token(session, get_settings(), request.headers.get("authorization"))


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


@dataclass(frozen=True)
class SubmitClaim:
    """Who asks to submit: a token row checked now, or one this process checked before (seen).

    A seen token is not re-read: the write it asks for must itself require the token to be
    unrevoked (service/runs/records.queue_run does, in the INSERT), and on refusal the route calls
    authenticate() with the secret for the precise error.
    """

    token: ApiToken | SeenToken
    secret: str | None

    @property
    def seen(self) -> bool:
        """True when the token was not looked up for this request."""
        return isinstance(self.token, SeenToken)


async def claim_submit(session: SessionDep, authorization: Annotated[str | None, Header()] = None) -> SubmitClaim:
    """The submit scope, from this process's memory of the token when it can, else checked in the database."""
    secret = _bearer(authorization)
    seen = recall(secret, "submit")
    if seen is not None:
        return SubmitClaim(seen, secret)
    return SubmitClaim(await run_in_threadpool(authenticate, session, token=secret, scope="submit"), secret)


SubmitToken = Annotated[ApiToken, Depends(require_submit)]
SubmitClaimDep = Annotated[SubmitClaim, Depends(claim_submit)]
AdminToken = Annotated[ApiToken, Depends(require_admin)]
ReadAccess = Annotated[ApiToken | None, Depends(require_read)]
