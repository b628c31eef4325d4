"""/api/v1 regressions, notification channels and known upstream bugs: the on-call side of the API."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from models import KnownFailure, NotificationChannel, Regression
from service.core.deps import AdminToken, ReadAccess, RowId, SessionDep, SubmitToken
from service.core.links import BaseUrl, regression_url, run_url
from service.core.schemas import ERROR_RESPONSES
from service.oncall import channels as channel_service
from service.oncall import known_failures
from service.oncall import regressions as regression_tracker
from service.oncall.destinations import mask_url
from service.oncall.schemas import (
    AckIn,
    ChannelIn,
    ChannelOut,
    KnownFailureIn,
    KnownFailureOut,
    RegressionOut,
)

router = APIRouter(prefix="/api/v1", tags=["on-call"], responses=ERROR_RESPONSES)
STATE_PATTERN = "^(open|acknowledged|resolved|unresolved)$"


def regression_out(reg: Regression, base: str) -> RegressionOut:
    """The API view of a regression, with absolute links."""
    out = RegressionOut.model_validate(reg)
    out.links = {"self": f"{base}/api/v1/regressions/{reg.id}", "dashboard": regression_url(base, reg.id),
                 "triage": run_url(base, reg.first_failing_run_id, "triage")}
    return out


@router.get("/regressions", response_model=list[RegressionOut])
def list_regressions(
    session: SessionDep, base: BaseUrl, _: ReadAccess,
    state: Annotated[str | None, Query(pattern=STATE_PATTERN)] = None,
    check: Annotated[str | None, Query(pattern="^[0-9a-f]{16}$")] = None,
    track: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[RegressionOut]:
    """Regressions, newest first; state is open, acknowledged, resolved or unresolved (open + acknowledged)."""
    rows = regression_tracker.list_regressions(session, state=state, check=check, track=track, limit=limit)
    return [regression_out(r, base) for r in rows]


@router.get("/regressions/{regression_id}", response_model=RegressionOut)
def get_regression(regression_id: RowId, session: SessionDep, base: BaseUrl, _: ReadAccess) -> RegressionOut:
    """One regression."""
    return regression_out(regression_tracker.get_regression(session, regression_id), base)


@router.post("/regressions/{regression_id}/acknowledge", response_model=RegressionOut)
def acknowledge(
    regression_id: RowId, body: AckIn, session: SessionDep, base: BaseUrl, token: SubmitToken
) -> RegressionOut:
    """Take ownership of a regression as the token's name, with a note and an upstream issue link (403 unless
    the token may write the regression's track)."""
    # the owner is who is asking, never free text: a body field let any token acknowledge as anyone
    reg = regression_tracker.acknowledge(session, regression_id, grant=token, note=body.note,
                                         upstream_url=body.upstream_url)
    return regression_out(reg, base)


def channel_out(channel: NotificationChannel, counts: dict[str, int] | None = None) -> ChannelOut:
    """A channel without its secrets: no shared secret, and the URL masked (a Slack webhook URL is a credential)."""
    return ChannelOut(id=channel.id, name=channel.name, kind=channel.kind, url=mask_url(channel.url),
                      events=channel.events, enabled=channel.enabled, signed=bool(channel.secret),
                      outbox=counts or {}, created_at=channel.created_at)


@router.get("/notifications/channels", response_model=list[ChannelOut])
def list_channels(session: SessionDep, _: AdminToken) -> list[ChannelOut]:
    """Configured channels with their outbox counts (pending, delivered, dead); secrets never leave."""
    return [channel_out(c, n) for c, n in channel_service.list_channels(session)]


@router.post("/notifications/channels", status_code=201, response_model=ChannelOut)
def add_channel(body: ChannelIn, session: SessionDep, _: AdminToken) -> ChannelOut:
    """Add a generic JSON webhook (HMAC-signed with secret) or a Slack incoming webhook."""
    channel = channel_service.create_channel(session, name=body.name, kind=body.kind, url=body.url,
                                             secret=body.secret, events=body.events)
    return channel_out(channel)


@router.delete("/notifications/channels/{channel_id}", status_code=204)
def delete_channel(channel_id: RowId, session: SessionDep, _: AdminToken) -> Response:
    """Remove a channel (and its undelivered messages)."""
    channel_service.delete_channel(session, channel_id)
    return Response(status_code=204)


def known_out(row: KnownFailure) -> KnownFailureOut:
    """The API view of a known-failure entry."""
    return KnownFailureOut.model_validate(row)


@router.get("/known-failures", response_model=list[KnownFailureOut])
def list_known(session: SessionDep, _: ReadAccess, include_retired: bool = False) -> list[KnownFailureOut]:
    """Known upstream bugs (active ones unless include_retired)."""
    return [known_out(r) for r in known_failures.list_known(session, include_retired=include_retired)]


@router.post("/known-failures", status_code=201, response_model=KnownFailureOut)
def add_known(body: KnownFailureIn, session: SessionDep, token: AdminToken) -> KnownFailureOut:
    """Record: on these environments (or Megatron-Core versions), signature S is a known upstream bug."""
    row = known_failures.create(session, signature=body.signature, environments=body.environments,
                                mcore_versions=body.mcore_versions, link=body.link, note=body.note,
                                created_by=token.name)
    return known_out(row)


@router.post("/known-failures/{known_id}/retire", response_model=KnownFailureOut)
def retire_known(known_id: RowId, session: SessionDep, _: AdminToken) -> KnownFailureOut:
    """Stop treating an entry as known (e.g. after a run flagged it `fixed?`)."""
    return known_out(known_failures.retire(session, known_id))
