"""/api/v1 configs and health; /metrics for Prometheus."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select, text

from jobs.config_listing import list_configs
from models import Phase, Regression, Run, SchedulerHeartbeat
from models.base import utcnow
from service.core.db import session_scope
from service.core.deps import ReadAccess, SessionDep, SettingsDep
from service.core.run_state import IN_FLIGHT, RunState
from service.core.schemas import ERROR_RESPONSES
from service.executors.selection import slurm_status
from service.runs import retention
from service.runs.pool_dispatch import pool_summary

router = APIRouter(prefix="/api/v1", tags=["meta"], responses=ERROR_RESPONSES)
HEARTBEAT_STALE = timedelta(seconds=60)


@router.get("/configs")
def configs(_: ReadAccess) -> list[dict[str, Any]]:
    """Named model configs with their parameters and why each exists."""
    return list_configs()


@router.get("/livez")
def livez() -> dict[str, str]:
    """Liveness for load balancers and container health checks: open to all, and says nothing else."""
    return {"status": "ok"}


@router.get("/healthz")
def healthz(settings: SettingsDep, _: ReadAccess) -> JSONResponse:
    """Database, scheduler heartbeat and the executor in use (Slurm's reachability, or the local limit);
    503 when the database is down. Behind the read token when reads require one (GET /api/v1/livez
    stays open).
    """
    body: dict[str, Any] = {}
    try:
        with session_scope() as session:
            version = session.scalar(text("show server_version"))
            latest = session.execute(
                select(SchedulerHeartbeat.seen_at, SchedulerHeartbeat.detail)
                .order_by(SchedulerHeartbeat.seen_at.desc()).limit(1)
            ).first()
        body["database"] = {"ok": True, "server_version": version}
        beat = latest.seen_at if latest else None
        fresh = beat is not None and utcnow() - beat < HEARTBEAT_STALE
        # the executor the scheduler decided at its start-up (heartbeat detail "executor=...")
        executor = dict(p.split("=", 1) for p in (latest.detail if latest else "").split() if "=" in p).get("executor")
        body["scheduler"] = {"ok": fresh, "last_heartbeat": beat.isoformat() if beat else None, "executor": executor}
    except Exception as exc:  # any driver error means "down"; the message says which
        body["database"] = {"ok": False, "detail": str(exc).splitlines()[0]}
        body["scheduler"] = {"ok": False, "last_heartbeat": None, "executor": None}
    # only the executor in use: a local scheduler's health is not Slurm's DNS error
    in_use = body["scheduler"].get("executor") or (settings.executor if settings.executor != "auto" else None)
    if in_use == "local":
        body["local"] = {"ok": True, "max_running": settings.local_max_running,
                         "configured_executor": settings.executor}
    else:
        reachable, detail = slurm_status()
        body["slurm"] = {"ok": reachable, "detail": detail, "configured_executor": settings.executor}
    body["disk"] = retention.disk_usage(settings)
    pool = pool_summary(settings)
    body["pool"] = {k: v for k, v in pool.items() if k != "list"}
    body["status"] = "ok" if body["database"]["ok"] else "degraded"
    return JSONResponse(body, status_code=200 if body["database"]["ok"] else 503)


@router.get("/pool")
def pool_state(settings: SettingsDep, _: ReadAccess) -> dict[str, Any]:
    """The warm pool (PARITY_POOL): its workers by state, and each worker's environment, tasks, job, age."""
    return pool_summary(settings)


@router.get("/metrics", include_in_schema=False)
def metrics_alias(session: SessionDep, settings: SettingsDep, access: ReadAccess) -> Response:
    """Same as /metrics, under the API prefix."""
    return prometheus_metrics(session, settings, access)


metrics_router = APIRouter()


@metrics_router.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
def prometheus_metrics(session: SessionDep, settings: SettingsDep, _: ReadAccess) -> Response:
    """Prometheus text: queue depth, runs by state and verdict, phase durations (a read token when reads need one)."""
    registry = CollectorRegistry()
    queue = Gauge("parity_queue_depth", "Runs waiting to be submitted", registry=registry)
    in_flight = Gauge("parity_runs_in_flight", "Runs with a phase submitted or running", registry=registry)
    by_state = Gauge("parity_runs", "Runs by state", ["state"], registry=registry)
    by_verdict = Gauge("parity_verdicts", "Finished runs by verdict", ["verdict"], registry=registry)
    regressions = Gauge("parity_regressions", "Runs flagged as regressions", registry=registry)
    durations = Gauge(
        "parity_phase_duration_seconds_avg", "Mean duration of finished phases", ["phase"], registry=registry
    )
    counts = dict(session.execute(select(Run.state, func.count()).group_by(Run.state)).tuples().all())
    for state in RunState:
        by_state.labels(state.value).set(counts.get(state.value, 0))
    queue.set(counts.get(RunState.QUEUED.value, 0))
    in_flight.set(sum(counts.get(s.value, 0) for s in IN_FLIGHT))
    for verdict, n in session.execute(
        select(Run.verdict, func.count()).where(Run.verdict.is_not(None)).group_by(Run.verdict)
    ).tuples():
        by_verdict.labels(verdict).set(n)
    regressions.set(session.scalar(select(func.count()).where(Run.regression.is_(True))) or 0)
    for name, avg in session.execute(
        select(Phase.name, func.avg(Phase.duration_s)).where(Phase.duration_s.is_not(None)).group_by(Phase.name)
    ).tuples():
        durations.labels(name).set(float(avg or 0))
    oncall_metrics(session, registry)
    pool_metrics(settings, registry)
    usage = retention.disk_usage(settings)
    Gauge("parity_run_folder_bytes", "Bytes used by the run folder (logs, checkpoints)",
          registry=registry).set(usage["run_folder_bytes"])
    Gauge("parity_run_folder_fs_free_bytes", "Free bytes on the run folder's file system",
          registry=registry).set(usage["fs_free_bytes"])
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def pool_metrics(settings: SettingsDep, registry: CollectorRegistry) -> None:
    """The warm pool: workers by state per environment and world size, and the oldest worker's age."""
    workers = Gauge("parity_pool_workers", "Warm pool workers by environment, tasks and state",
                    ["environment", "tasks", "state"], registry=registry)
    summary = pool_summary(settings)
    for state in ("busy", "idle", "starting"):
        Gauge(f"parity_pool_{state}", f"Warm pool workers {state}", registry=registry).set(summary[state])
    Gauge("parity_pool_worker_count", "Warm pool workers alive (any state)", registry=registry).set(summary["workers"])
    Gauge("parity_pool_oldest_worker_age_seconds", "Age of the oldest warm worker (0 when none)",
          registry=registry).set(summary["oldest_age_s"])
    counts: dict[tuple[str, str, str], int] = {}
    for w in summary["list"]:
        key = (str(w["environment"])[:100], str(w["tasks"]), str(w["state"]))
        counts[key] = counts.get(key, 0) + 1
    for (env, tasks, state), n in counts.items():
        workers.labels(env, tasks, state).set(n)


# at most this many (check, track) series; the rest are summed into check="other", track="other"
MAX_REGRESSION_SERIES = 50


def oncall_metrics(session: SessionDep, registry: CollectorRegistry) -> None:
    """Open regressions per check × track (bounded cardinality) and the age of the oldest queued run."""
    open_regs = Gauge("parity_open_regressions", "Unresolved regressions by check and track",
                      ["check", "check_name", "track", "state"], registry=registry)
    oldest = Gauge("parity_oldest_queued_run_age_seconds", "Age of the oldest run still queued (0 when none)",
                   registry=registry)
    rows = session.execute(
        select(Regression.check_key, Regression.check_name, Regression.track, Regression.state, func.count())
        .where(Regression.state.in_(("open", "acknowledged")))
        .group_by(Regression.check_key, Regression.check_name, Regression.track, Regression.state)
        .order_by(func.min(Regression.created_at))
    ).tuples().all()
    overflow: dict[str, int] = {}
    for i, (key, name, track, state, n) in enumerate(rows):
        if i < MAX_REGRESSION_SERIES:
            open_regs.labels(key, name[:100], track[:100], state).set(n)
        else:
            overflow[state] = overflow.get(state, 0) + n
    for state, n in overflow.items():
        open_regs.labels("other", "other", "other", state).set(n)
    first = session.scalar(select(func.min(Run.created_at)).where(Run.state == RunState.QUEUED.value))
    oldest.set(max(0.0, (utcnow() - first).total_seconds()) if first else 0.0)
