"""HTML routes of the dashboard, mounted on the API's FastAPI app (JSON stays under /api/v1)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy import select

from jobs.verdict.signatures import SIGNATURES
from models import Environment, Phase
from service.core.deps import RowId, RunId, SessionDep, SettingsDep
from service.core.links import BaseUrl
from service.runs.pool_dispatch import pool_summary
from service.tracks.overview import track_rows
from service.web.dashboard import history as history_q
from service.web.dashboard import logs as logs_q
from service.web.dashboard import oncall_pages, runlist, runpage
from service.web.dashboard import overview as overview_q
from service.web.dashboard import triage as triage_q
from service.web.dashboard.auth import DashboardRead, LoginRequired
from service.web.dashboard.issue_markdown import issue_markdown
from service.web.dashboard.rendering import STATIC, PageError, page_error, render

router = APIRouter(include_in_schema=False, default_response_class=HTMLResponse)
LOG_LINES = 500
PR_SUITE_RUNS = 20  # the overview's list of pull requests' suite runs; /suite-runs has them all


def mount(app: FastAPI) -> None:
    """Add the dashboard's pages, its static files and its HTML error handler to the app."""
    app.include_router(router)
    app.include_router(oncall_pages.router)
    app.add_exception_handler(LoginRequired, oncall_pages.login_required_handler)
    app.mount("/static/dashboard", StaticFiles(directory=STATIC), name="dashboard-static")
    app.add_exception_handler(PageError, page_error)


@router.get("/")
def overview(request: Request, session: SessionDep, settings: SettingsDep, _: DashboardRead) -> Response:
    """The parity matrix over the long-lived tracks, regressions first; pull requests as their latest suite runs;
    watched tracks with the commit that changed each check."""
    from service.suites.runs import suite_run_list

    patterns = settings.long_lived_tracks
    return render(request, "overview.html", {
        "m": overview_q.matrix(session, long_lived_tracks=patterns), "now": datetime.now(UTC),
        "prs": suite_run_list(session, page_size=PR_SUITE_RUNS, prs_only=patterns),
        "open_regressions": oncall_pages.open_regression_count(session), "tracks": track_rows(session)})


@router.get("/runs")
def runs(request: Request, session: SessionDep, _: DashboardRead) -> Response:
    """Filterable, sortable, paginated run list."""
    args = {key: request.query_params.getlist(key) for key in request.query_params}
    query = runlist.parse_query(args)
    page = runlist.page_of_runs(session, query)
    return render(request, "runs.html", {"q": query, "page": page, "choices": runlist.choices(session),
                                         "now": datetime.now(UTC)})


@router.get("/sweeps/{sweep_id}")
def sweep(request: Request, sweep_id: str, session: SessionDep, _: DashboardRead) -> Response:
    """A sweep's grid (environment × variation rows, config columns) filling in as runs finish."""
    from service.sweeps.grid import sweep_grid

    return render(request, "sweep.html", {"g": sweep_grid(session, sweep_id=sweep_id)})


@router.get("/suite-runs")
def suite_runs(request: Request, session: SessionDep, settings: SettingsDep, _: DashboardRead, page: int = 1,
               branch: str = "", suite: str = "", prs: str = "") -> Response:
    """Suite runs, newest first: verdict, suite name and version, build, PR, outcome counts; filterable by
    branch, suite and pull requests only (prs=only)."""
    from service.core.errors import NotFound
    from service.suites.runs import suite_run_list

    if prs not in ("", "only"):
        raise PageError(422, f"prs: expected 'only' or nothing, got {prs[:40]!r}")
    try:  # a page number past any real page (or one that overflows) is clamped, never a 500
        listing = suite_run_list(session, page=max(1, min(page, 10**6)), branch=branch[:200] or None,
                                 suite=suite[:100] or None,
                                 prs_only=settings.long_lived_tracks if prs else None)
    except NotFound as exc:
        raise PageError(404, exc.detail) from None
    return render(request, "suite_runs.html", {"l": listing, "f": {"branch": branch, "suite": suite, "prs": prs}})


@router.get("/suite-runs/{suite_run_id}")
def suite_run(request: Request, suite_run_id: str, session: SessionDep, base: BaseUrl, _: DashboardRead) -> Response:
    """A suite run: one row per check (outcome, cause, first divergent step, triage link) and the overall verdict."""
    from service.core.errors import NotFound
    from service.suites.runs import suite_run_view

    try:
        view = suite_run_view(session, suite_run_id=suite_run_id, base=base)
    except NotFound:
        raise PageError(404, f"suite run {suite_run_id} not found") from None
    return render(request, "suite_run.html", {"s": view})


@router.get("/bisects/{bisect_id}")
def bisect(request: Request, bisect_id: str, session: SessionDep, base: BaseUrl, _: DashboardRead) -> Response:
    """A bisect: each environment in order with the run that decided it, and the first bad one."""
    from models import Bisect
    from service.bisects.search import describe

    row = session.get(Bisect, bisect_id)
    if row is None:
        raise PageError(404, f"bisect {bisect_id} not found")
    return render(request, "bisect.html", {"b": describe(session, row, base)})


@router.get("/runs/{run_id}")
def run(request: Request, run_id: RunId, session: SessionDep, settings: SettingsDep, _: DashboardRead) -> Response:
    """One run: charts, per-step table, probe findings, phases, events."""
    context = runpage.run_page(session, run_id, settings.resolved_run_folder)
    return render(request, "run.html", context)


@router.get("/runs/{run_id}/triage")
def triage(
    request: Request, run_id: RunId, session: SessionDep, settings: SettingsDep, base: BaseUrl, _: DashboardRead
) -> Response:
    """What on-call needs for a failed or errored run."""
    context = triage_q.triage(session, run_id, run_folder=settings.resolved_run_folder, base_url=base)
    context["issue_md"] = issue_markdown(context, base) if context["failed"] else ""
    return render(request, "triage.html", context)


@router.get("/runs/{run_id}/phases/{phase_id}/log")
def phase_log(
    request: Request, run_id: RunId, phase_id: RowId, session: SessionDep, settings: SettingsDep, _: DashboardRead,
    path: str = "", raw: bool = False, lines: int = LOG_LINES,
) -> Response:
    """One log file of a phase (its tail), only from inside the run folder."""
    phase = session.get(Phase, phase_id)
    if phase is None or phase.run_id != run_id:
        raise PageError(404, f"run {run_id} has no phase {phase_id}")
    target = logs_q.resolve_log(settings.resolved_run_folder, phase, path)
    text, cut = logs_q.read_tail(target)
    if raw:
        return PlainTextResponse("\n".join(text) + "\n", headers={"X-Content-Type-Options": "nosniff"})
    start = max(0, len(text) - max(1, lines))
    return render(request, "log.html", {
        "run_id": run_id, "phase": phase, "path": path, "lines": logs_q.numbered(text[start:], start),
        "shown_from": start, "total": len(text), "truncated": cut,
    })


@router.get("/configs/{name}")
def config_history(
    request: Request, name: str, session: SessionDep, _: DashboardRead, environment: str | None = None,
    check: str | None = None, track: str | None = None,
) -> Response:
    """One config's checks × tracks, each with its verdicts over time; the |Δloss| trend of one of them."""
    return render(request, "config.html", {"h": history_q.history(session, name, environment or None,
                                                                  check=check or None, track=track or None)})


@router.get("/environments/{name}")
def environment_page(request: Request, name: str, session: SessionDep, _: DashboardRead) -> Response:
    """One environment: its build's identity and what the harness detected in it."""
    env = session.scalar(select(Environment).where(Environment.name == name))
    if env is None:
        raise PageError(404, f"no environment named {name!r}")
    caps = env.packages.get("capabilities") if isinstance(env.packages, dict) else None
    return render(request, "environment.html", {"env": env, "capabilities": caps if isinstance(caps, dict) else {}})


@router.get("/signatures")
def signatures(request: Request, _: DashboardRead) -> Response:
    """Every known failure signature, in plain words, with its upstream references."""
    return render(request, "signatures.html", {"signatures": list(SIGNATURES.values())})


@router.get("/pool")
def pool_page(request: Request, settings: SettingsDep, _: DashboardRead) -> Response:
    """The warm pool: workers by state, each worker's environment, tasks, job, age and current order."""
    return render(request, "pool.html", {"pool": pool_summary(settings)})
