"""/api/v1/runs: what CI calls to queue a parity check and read its answer."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.verdict_names import RUN_VERDICTS
from models import ProbeFinding, Run, StepMetric
from service.core.db import get_engine
from service.core.deps import (
    ReadAccess,
    RunId,
    SessionDep,
    SettingsDep,
    SubmitToken,
)
from service.core.errors import InvalidSpec
from service.core.inputs import MAX_OFFSET, Instant
from service.core.links import BaseUrl
from service.core.outcome import check_result, of_result
from service.core.run_state import TERMINAL, RunState
from service.core.schemas import (
    ERROR_RESPONSES,
    PhaseOut,
    ProbeFindingOut,
    RunCreate,
    RunLinks,
    RunMetrics,
    RunOut,
    RunPage,
    StepMetricOut,
)
from service.core.settings import Settings
from service.core.state_names import MAX_WAIT_S
from service.core.tracks import authorize_track
from service.core.verdicts import reading
from service.environments.registry import (
    DEFAULT_ENVIRONMENT,
    ensure_default_environment,
    get_environment,
    use_environment,
)
from service.executors import gpus
from service.oncall.flagging import regression_text
from service.runs import changes
from service.runs import records as run_service
from service.runs.admission import Caps

# the contract's verdicts plus the service's known-failure, whatever names they grow
VERDICT_PATTERN = "^(" + "|".join(re.escape(v) for v in RUN_VERDICTS) + ")$"
router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=ERROR_RESPONSES)


def run_links(run_id: int, base: str) -> RunLinks:
    """Absolute links for a run: API resource, metrics, dashboard page, triage page."""
    return RunLinks(
        self=f"{base}/api/v1/runs/{run_id}",
        metrics=f"{base}/api/v1/runs/{run_id}/metrics",
        dashboard=f"{base}/runs/{run_id}",
        triage=f"{base}/runs/{run_id}/triage",
    )


def caps(settings: Settings) -> Caps:
    """The admission limits from settings."""
    return Caps(max_in_flight=settings.max_in_flight, max_queued_per_requester=settings.max_queued_per_requester,
                gpus=gpus.Budget(settings))


_NOT_COLUMNS = frozenset({"environment", "links", "phases", "regression_text", "known_failures", "fixed_known",
                          "verdict_label", "worked_around", "worked_around_by", "reading", "outcome"})


def run_out(run: Run, base: str, *, with_phases: bool = False) -> RunOut:
    """The API view of a run (environment and, if asked, phases already loaded)."""
    fields = {name: getattr(run, name) for name in RunOut.model_fields if name not in _NOT_COLUMNS}
    fields.update(environment=run.environment.name, links=run_links(run.id, base), phases=None,
                  regression_text=regression_text(run) or None,
                  known_failures=list((run.summary or {}).get("known_failures") or []),
                  fixed_known=list((run.summary or {}).get("known_fixed") or []))
    summary = run.summary or {}
    read = reading(run)
    fields.update(verdict_label=read.label if run.verdict else None, reading=read.to_dict(),
                  worked_around=list(summary.get("worked_around") or []),
                  worked_around_by=dict(summary.get("worked_around_by") or {}),
                  outcome=of_result(check_result(run.state, run.verdict, run.regression, summary.get("fails_on_base"))))
    if with_phases:
        fields["phases"] = [PhaseOut.model_validate(p) for p in run.phases]
    return RunOut(**fields)


def json_response(model: BaseModel, *, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """The model as JSON, serialised once by pydantic.

    Returning the model itself makes FastAPI dump it to a dict, validate that dict against the
    response model again and serialise the copy: three passes where one suffices on the hot paths
    CI polls. The declared response_model still documents the body.
    """
    return Response(model.model_dump_json(), status_code=status_code, headers=headers, media_type="application/json")


@router.post("", status_code=202, response_model=RunOut)
def create_run(
    body: RunCreate,
    session: SessionDep,
    settings: SettingsDep,
    base: BaseUrl,
    token: SubmitToken,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> Response:
    """Queue a parity run. A repeated Idempotency-Key returns the run it created first."""
    spec = body.spec.run_spec  # parsed once, with the body
    # the track this run writes (its branch label, else its environment) must be the token's: before any write
    authorize_track(token, labels=body.labels, environment=body.environment)
    if body.environment == DEFAULT_ENVIRONMENT:
        environment = ensure_default_environment(session, settings=settings)
    else:
        environment = get_environment(session, name=body.environment)
    use_environment(environment)
    run, created = run_service.create_run(
        session,
        spec=spec,
        environment=environment,
        labels=body.labels,
        requester=token.name,
        token_id=token.id,
        idempotency_key=idempotency_key,
        caps=caps(settings),
    )
    headers = {"Location": f"/api/v1/runs/{run.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
        run = run_service.get_run(session, run_id=run.id)
    return json_response(run_out(run, base), status_code=202, headers=headers)


def _parse_labels(label: list[str]) -> dict[str, str]:
    out = {}
    for item in label:
        if "=" not in item:
            raise InvalidSpec(f"label: expected key=value, got {item!r}", field="label")
        key, value = item.split("=", 1)
        out[key] = value
    return out


@router.get("", response_model=RunPage)
def list_runs(
    request: Request,
    session: SessionDep,
    base: BaseUrl,
    _: ReadAccess,
    config: str | None = None,
    check: Annotated[str | None, Query(description="check key (GET /runs items carry check_key)",
                                       pattern="^[0-9a-f]{16}$")] = None,
    track: Annotated[str | None, Query(max_length=200, description="branch label, else environment name")] = None,
    environment: str | None = None,
    state: RunState | None = None,
    verdict: Annotated[str | None, Query(pattern=VERDICT_PATTERN)] = None,
    regression: bool | None = None,
    label: Annotated[list[str], Query(description="key=value, repeatable")] = [],  # noqa: B006
    since: Instant | None = None,
    until: Instant | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> RunPage:
    """Runs, newest first, filtered and paginated."""
    filters = run_service.RunFilter(
        config=config,
        check=check,
        track=track,
        environment=environment,
        state=state.value if state else None,
        verdict=verdict,
        regression=regression,
        labels=_parse_labels(label) or None,
        since=since,
        until=until,
    )
    runs, has_more = run_service.list_runs(session, filters=filters, limit=limit, offset=offset)
    next_url = None
    if has_more:
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "offset"]
        next_url = f"{request.url.path}?{urlencode([*params, ('offset', str(offset + limit))])}"
    return RunPage(
        items=[run_out(r, base) for r in runs], limit=limit, offset=offset, has_more=has_more, next=next_url
    )


@router.get("/{run_id}", response_model=RunOut)
def get_run(run_id: RunId, session: SessionDep, base: BaseUrl, _: ReadAccess) -> Response:
    """One run with its phases, verdict, signatures and links."""
    # the read ends its own transaction in this thread: the session's end then has nothing to send and
    # no second threadpool trip to make (what CI polls, measured: docs/measurements.md)
    return json_response(_read_released(session, run_id, base))


# A long poll's longest wait: a waiting client asks again at least this often (a proxy's idle timeout
# is longer), and a missed notification delays an answer by no more than this.


async def database_url() -> str:
    """The configured database's URL (resolved in a thread the first time: it may start Postgres)."""
    return await run_in_threadpool(lambda: get_engine().url.render_as_string(hide_password=False))


def _read_released(session: Session, run_id: int, base: str) -> RunOut:
    # the read ends its transaction at once: a waiting request holds no pooled connection. Autocommit
    # when nothing began yet: one statement is one round trip, no BEGIN and no ROLLBACK (a read needs
    # neither; measured: docs/measurements.md)
    if not session.in_transaction():
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    try:
        return run_out(run_service.get_run(session, run_id=run_id, with_phases=True), base, with_phases=True)
    finally:
        session.rollback()


@router.get("/{run_id}/wait", response_model=RunOut)
async def wait_for_run(
    run_id: RunId, session: SessionDep, base: BaseUrl, _: ReadAccess,
    after: Annotated[int, Query(ge=0, description="the state_version the caller last saw")],
    timeout_s: Annotated[float, Query(gt=0, le=MAX_WAIT_S, description="the longest wait")] = MAX_WAIT_S,
) -> Response:
    """The run once its state_version is past `after` (or it is finished), else as it is after timeout_s.

    What `parity submit --wait` asks: one request per change or per timeout_s, answered within a
    notification's round trip of the scheduler's commit (service/runs/changes.py)."""
    await run_in_threadpool(session.rollback)  # the token check's connection goes back before the wait
    listening = await changes.listener(await database_url())
    with listening.watch([run_id]) as waiter:  # before the read: a change in between is not missed
        out = await run_in_threadpool(_read_released, session, run_id, base)
        if out.state_version <= after and RunState(out.state) not in TERMINAL:
            await waiter.wait(timeout_s)
            out = await run_in_threadpool(_read_released, session, run_id, base)
    return json_response(out)


@router.get("/{run_id}/metrics", response_model=RunMetrics)
def get_metrics(run_id: RunId, session: SessionDep, _: ReadAccess) -> RunMetrics:
    """Per-step metrics of the baseline and resumed runs with deltas, and probe findings."""
    run_service.get_run(session, run_id=run_id)
    steps = session.scalars(select(StepMetric).where(StepMetric.run_id == run_id).order_by(StepMetric.step))
    probes = session.scalars(select(ProbeFinding).where(ProbeFinding.run_id == run_id).order_by(ProbeFinding.id))
    return RunMetrics(
        run_id=run_id,
        steps=[StepMetricOut.model_validate(s) for s in steps],
        probes=[ProbeFindingOut.model_validate(p) for p in probes],
    )


@router.post("/{run_id}/cancel", response_model=RunOut)
def cancel_run(run_id: RunId, session: SessionDep, settings: SettingsDep, base: BaseUrl, token: SubmitToken) -> RunOut:
    """Cancel a queued run, or ask the scheduler to cancel a running one (its requester or an admin)."""
    run = run_service.cancel_run(session, run_id=run_id, token_id=token.id, scopes=list(token.scopes))
    return run_out(run, base)


@router.post("/{run_id}/rerun", status_code=202, response_model=RunOut)
def rerun(run_id: RunId, session: SessionDep, settings: SettingsDep, base: BaseUrl, token: SubmitToken) -> RunOut:
    """Queue a fresh run with the same spec, environment and labels (its requester or an admin)."""
    run = run_service.rerun(session, run_id=run_id, requester=token.name, scopes=list(token.scopes),
                            token_id=token.id, caps=caps(settings), writer=token)
    return run_out(run, base)
