"""The database goes away for a while: the scheduler waits it out, the API answers 503, nothing is lost."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, func, make_url, select

from models import SchedulerHeartbeat
from tests.plugins.scheduler_harness import service_env, start, stop, wait_for
from tests.plugins.tcp_proxy import Proxy


def _beat(url: str) -> float | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            seen = conn.execute(select(func.max(SchedulerHeartbeat.seen_at))).scalar()
            return seen.timestamp() if seen else None
    finally:
        engine.dispose()


def test_scheduler_and_api_survive_a_database_outage(committed_db: str, tmp_path: Path) -> None:
    real = make_url(committed_db)
    proxy = Proxy(real.host or "127.0.0.1", real.port or 5432)
    via_proxy = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    env = service_env(tmp_path, PARITY_DATABASE_URL=via_proxy, PARITY_EXECUTOR="local")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        first = wait_for(lambda: _beat(committed_db), 60, "a heartbeat", alive=[scheduler])
        proxy.down()
        log = tmp_path / "scheduler.log"
        # it must live through more than one failed attempt (wait_for fails if the scheduler dies)
        wait_for(lambda: log.read_text().count("database unavailable") >= 2, 60,
                 "the scheduler to retry through the outage", alive=[scheduler])
        proxy.restore()
        wait_for(lambda: (_beat(committed_db) or 0) > first + 5, 90, "heartbeats after the outage",
                 alive=[scheduler])
    finally:
        stop(scheduler)
        proxy.close()


def test_api_answers_503_while_the_database_is_away(database_url: str, settings_env: None, monkeypatch) -> None:
    from fastapi.testclient import TestClient

    from service.core.db import reset_engine
    from service.core.settings import get_settings
    from service.web.app import create_app

    real = make_url(database_url)
    proxy = Proxy(real.host or "127.0.0.1", real.port or 5432)
    monkeypatch.setenv(
        "PARITY_DATABASE_URL", real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    )
    get_settings.cache_clear()
    reset_engine()
    try:
        with TestClient(create_app()) as client:
            assert client.get("/api/v1/runs").status_code == 200
            proxy.down()
            resp = client.get("/api/v1/runs")
            assert resp.status_code == 503
            assert resp.json()["error"] == "database_unavailable"
            assert client.get("/api/v1/healthz").status_code == 503
            proxy.restore()
            assert client.get("/api/v1/runs").status_code == 200
    finally:
        proxy.close()
        reset_engine()
