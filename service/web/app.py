"""The FastAPI application: REST API, Prometheus metrics, dashboard; one error shape."""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.artifacts import api as artifacts
from service.bisects import api as bisects
from service.core.errors import DomainError
from service.core.inputs import refuse_unstorable
from service.core.limits import BodyLimit
from service.core.settings import get_settings
from service.environments import api as environments
from service.oncall import api as oncall
from service.runs import api as runs
from service.suites import api as suites
from service.sweeps import api as sweeps
from service.tracks import api as tracks
from service.web import meta
from service.web.dashboard import routes as dashboard


def _domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    retry_after = getattr(exc, "retry_after", None)
    return JSONResponse(
        {"error": exc.code, "detail": exc.detail, "field": exc.field}, status_code=exc.status_code,
        headers={"Retry-After": str(retry_after)} if retry_after else None,
    )


def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    detail = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
    # only the plain parts: pydantic's ctx may hold exception objects that JSON cannot carry
    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": str(e.get("type"))}
              for e in exc.errors()]
    return JSONResponse(
        {"error": "invalid_request", "detail": detail, "field": field, "errors": errors}, status_code=422
    )


def _first_line(exc: BaseException) -> str:
    # SQLAlchemy's text is the driver's error, then the statement and a link: the first line says it
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _database_down(_: Request, exc: Exception) -> JSONResponse:
    # The client may send the request again (a POST with its Idempotency-Key). A write whose
    # connection broke is never sent again by the service: it may have committed.
    reason = _first_line(exc)
    # a connection that broke under the request renewed the pool: the next send is likely served
    renewed = getattr(exc, "connection_invalidated", False)
    return JSONResponse(
        {"error": "database_unavailable", "detail": f"database: {reason[:300]}", "field": None},
        status_code=503, headers={"Retry-After": "1" if renewed else "10"},
    )


HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}


def _http_error(_: Request, exc: Exception) -> JSONResponse:
    # framework-raised errors (malformed JSON body, unknown path, wrong method) in the same shape
    assert isinstance(exc, StarletteHTTPException)
    code = HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    return JSONResponse({"error": code, "detail": str(exc.detail), "field": None}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


def create_app() -> FastAPI:
    """Build the app; the database is resolved lazily on the first request that needs it."""
    app = FastAPI(
        title="Megatron-Core resume-parity service",
        version="0.1.0",
        description="Save at step N, resume in a fresh process, continue to M: is the run the same?",
        # every route, one check: strings Postgres cannot store are a 422 naming the field, never a 500
        dependencies=[Depends(refuse_unstorable)],
    )
    app.add_exception_handler(DomainError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(InterfaceError, _database_down)
    # uploads stream past the JSON limit under their own (read per request, so tests can change it)
    app.add_middleware(BodyLimit, streamed={"/api/v1/artifacts": lambda: get_settings().artifact_max_bytes})
    app.include_router(runs.router)
    app.include_router(environments.router)
    app.include_router(artifacts.router)
    app.include_router(suites.router)
    app.include_router(suites.runs_router)
    app.include_router(sweeps.router)
    app.include_router(bisects.router)
    app.include_router(tracks.sources_router)
    app.include_router(tracks.router)
    app.include_router(oncall.router)
    app.include_router(meta.router)
    app.include_router(meta.metrics_router)
    dashboard.mount(app)
    return app
