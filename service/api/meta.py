"""/api/v1 configs, environments, health; /metrics for Prometheus."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select, text

from jobs.configs import list_configs
from models import Phase, Run, SchedulerHeartbeat
from models.base import utcnow
from service import retention
from service.api.deps import AdminToken, ReadAccess, SessionDep, SettingsDep
from service.api.schemas import ERROR_RESPONSES, EnvironmentIn, EnvironmentOut
from service.db import session_scope
from service.environments import create_environment, ensure_default_environment, list_environments
from service.slurm import pick_executor, slurm_status
from service.state import IN_FLIGHT, RunState

router = APIRouter(prefix="/api/v1", tags=["meta"], responses=ERROR_RESPONSES)
HEARTBEAT_STALE = timedelta(seconds=60)


@router.get("/configs")
def configs(_: ReadAccess) -> list[dict[str, Any]]:
    """Named model configs with their parameters and why each exists."""
    return list_configs()


@router.get("/environments", response_model=list[EnvironmentOut])
def environments(session: SessionDep, settings: SettingsDep, _: ReadAccess) -> list[EnvironmentOut]:
    """Registered environments (the default one is created on first use)."""
    ensure_default_environment(session, settings=settings)
    return [EnvironmentOut.model_validate(e) for e in list_environments(session)]


@router.post("/environments", status_code=201, response_model=EnvironmentOut)
def add_environment(body: EnvironmentIn, session: SessionDep, _: AdminToken) -> EnvironmentOut:
    """Register an environment: the Python that runs job phases for another Megatron-Core build."""
    env = create_environment(session, name=body.name, python=body.python, description=body.description)
    return EnvironmentOut.model_validate(env)


@router.get("/healthz")
def healthz(settings: SettingsDep) -> JSONResponse:
    """Database, scheduler heartbeat and Slurm reachability; 503 when the database is down."""
    body: dict[str, Any] = {}
    try:
        with session_scope() as session:
            version = session.scalar(text("show server_version"))
            beat = session.scalar(select(func.max(SchedulerHeartbeat.seen_at)))
        body["database"] = {"ok": True, "server_version": version}
        fresh = beat is not None and utcnow() - beat < HEARTBEAT_STALE
        body["scheduler"] = {"ok": fresh, "last_heartbeat": beat.isoformat() if beat else None}
    except Exception as exc:  # any driver error means "down"; the message says which
        body["database"] = {"ok": False, "detail": str(exc).splitlines()[0]}
        body["scheduler"] = {"ok": False, "last_heartbeat": None}
    reachable, detail = slurm_status()
    body["slurm"] = {"ok": reachable, "detail": detail, "executor": pick_executor(settings)}
    body["disk"] = retention.disk_usage(settings)
    body["status"] = "ok" if body["database"]["ok"] else "degraded"
    return JSONResponse(body, status_code=200 if body["database"]["ok"] else 503)


@router.get("/metrics", include_in_schema=False)
def metrics_alias(session: SessionDep, settings: SettingsDep) -> Response:
    """Same as /metrics, under the API prefix."""
    return prometheus_metrics(session, settings)


metrics_router = APIRouter()


@metrics_router.get("/metrics", tags=["meta"], response_class=PlainTextResponse)
def prometheus_metrics(session: SessionDep, settings: SettingsDep) -> Response:
    """Prometheus text: queue depth, runs by state and verdict, phase durations."""
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
    usage = retention.disk_usage(settings)
    Gauge("parity_run_folder_bytes", "Bytes used by the run folder (logs, checkpoints)",
          registry=registry).set(usage["run_folder_bytes"])
    Gauge("parity_run_folder_fs_free_bytes", "Free bytes on the run folder's file system",
          registry=registry).set(usage["fs_free_bytes"])
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
