"""Bodies of the on-call API: regressions, notification channels, known upstream bugs."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class RegressionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    state: str = Field(description="open, acknowledged or resolved")
    check_key: str
    check_name: str
    config: str
    track: str
    compared_track: str
    first_failing_run_id: int
    last_good_run_id: int | None
    latest_failing_run_id: int
    failing_run_ids: list[int]
    signatures: list[str]
    acknowledged_by: str | None
    acknowledged_at: datetime | None
    note: str | None
    upstream_url: str | None
    resolved_at: datetime | None
    fixed_by_run_id: int | None
    created_at: datetime
    bisect_id: str | None = Field(default=None, description="The bisect over the track's commits ('none': "
                                  "none could start)")
    first_bad_commit: str | None = Field(default=None, description="The first bad commit its bisect named")
    first_bad_subject: str | None = None
    links: dict[str, str] = Field(default_factory=dict)


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=4000)
    upstream_url: str | None = Field(default=None, max_length=1000, pattern=r"^https?://")


class ChannelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,200}$")
    kind: str = Field(description="webhook (generic JSON, HMAC-signed) or slack (incoming-webhook payload)")
    url: str = Field(max_length=2000)
    secret: str | None = Field(default=None, min_length=16, max_length=500,
                               description="HMAC-SHA256 shared secret (required for webhook)")
    events: list[str] = Field(default_factory=list, description="Events to send; empty = all")


class ChannelOut(BaseModel):
    id: int
    name: str
    kind: str
    url: str = Field(description="Scheme, host and first path part only: the rest may be a credential")
    events: list[str]
    enabled: bool
    signed: bool
    outbox: dict[str, int]
    created_at: datetime


class KnownFailureIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    signature: str
    environments: list[str] = Field(default_factory=list, description="Environment names; empty = any")
    mcore_versions: str = Field(default="", max_length=200, description="PEP 440 range, e.g. '<=0.16.1'")
    link: str = Field(max_length=1000)
    note: str = Field(default="", max_length=4000)


class KnownFailureOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    signature: str
    environments: list[str]
    mcore_versions: str
    link: str
    note: str
    created_by: str | None
    created_at: datetime
    retired_at: datetime | None
