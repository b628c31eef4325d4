"""The suite run's JSON, typed: what `GET /api/v1/suite-runs/{id}` (and its wait, and the POST that queues one)
answers, and a page of the list. /openapi.json shows each field; the client reads `outcome` for its exit code."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from service.core.outcome import CiOutcome
from service.core.schemas import RunOut


class SuiteRunLinks(BaseModel):
    self: str
    dashboard: str


class CheckRegression(BaseModel):
    id: int
    state: str
    url: str


class SuiteCheckOut(BaseModel):
    name: str = Field(description="The check's name in the suite")
    outcome: str = Field(description="pass | known-failure | fails-on-base | fail | error | pending")
    cause: str = Field(description="Why it did not pass, as its reading says it ('' when it passed)")
    fails_on_base: str | None = Field(description="'fails on main too (since <commit>)' where the base shares it")
    run: RunOut
    regression: CheckRegression | None = Field(description="The regression it opened or joined, if any")


class SuiteRunOut(BaseModel):
    id: str
    suite: str
    version: int
    environment: str
    labels: dict[str, str]
    requester: str | None
    created_at: str = Field(description="ISO 8601")
    state: str = Field(description="running | finished")
    changes: int = Field(description="Grows with every state change of its runs: what a wait asks past")
    verdict: str | None = Field(description="pass | fail | error once every check ended, else null")
    counts: dict[str, int] = Field(description="Checks per outcome")
    checks: list[SuiteCheckOut]
    outcome: CiOutcome = Field(description="What CI exits with, with and without --strict (service/core/outcome.py)")
    links: SuiteRunLinks


class SuiteRunItem(BaseModel):
    id: str
    suite: str
    version: int
    environment: str
    requester: str | None
    created_at: datetime
    labels: dict[str, str]
    verdict: str | None
    checks: int = Field(description="How many checks it has")
    counts: dict[str, int]
    links: SuiteRunLinks


class SuiteRunPage(BaseModel):
    items: list[SuiteRunItem]
    total: int
    page: int
    pages: int
    page_size: int
