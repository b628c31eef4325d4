"""What the service shows: no statement parameters in errors, health and metrics behind the read token,
build logs never through a symlink or outside their folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from models import Environment
from service.core.db import get_engine
from tests.plugins.server import configure


def test_failed_statements_do_not_carry_their_parameters(committed_db: str) -> None:
    secret = "prt_SECRET_" + "x" * 300  # too long for the column: the INSERT fails
    with Session(get_engine()) as session:
        session.add(Environment(name=secret, python="/usr/bin/python3", description="", packages={}))
        with pytest.raises(DBAPIError) as failed:
            session.flush()
    assert "prt_SECRET_" not in str(failed.value), "the failed INSERT's message (and log line) holds the value"
    assert "hidden due to hide_parameters" in str(failed.value)


def test_health_and_metrics_need_the_read_token_when_reads_do(client: TestClient, make_token, monkeypatch) -> None:
    configure(monkeypatch, PARITY_READS_REQUIRE_TOKEN="1")
    for path in ("/api/v1/healthz", "/metrics", "/api/v1/metrics"):
        resp = client.get(path)
        assert resp.status_code == 401, f"{path} is open: {resp.text[:200]}"
        assert "server_version" not in resp.text and "parity_run_folder" not in resp.text
    live = client.get("/api/v1/livez")
    assert live.status_code == 200 and live.json() == {"status": "ok"}
    reader = make_token("read")
    assert client.get("/api/v1/healthz", headers=reader).json()["database"]["ok"] is True
    assert "parity_queue_depth" in client.get("/metrics", headers=reader).text


def _built(db_session: Session, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    db_session.add(Environment(name="hostile-build", python=str(folder / "venv/bin/python"), description="",
                               packages={}, state="failed", requirements=["x"], content_hash="0" * 64,
                               folder=str(folder), freeze=[]))
    db_session.flush()
    return "/api/v1/environments/hostile-build/log"


def test_build_log_is_never_read_through_a_symlink(client: TestClient, db_session: Session, tmp_path: Path) -> None:
    secret = tmp_path / "service-secret.env"
    secret.write_text("PARITY_DATABASE_URL=postgresql://parity:TOPSECRET@db/parity\n")
    folder = tmp_path / "runs" / "environments" / "abc"
    url = _built(db_session, folder)
    for target in (secret, Path("/proc/self/environ")):
        link = folder / "build.log"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        resp = client.get(url)
        assert resp.status_code == 404 and "TOPSECRET" not in resp.text and "PARITY_" not in resp.text, resp.text
    # a folder swapped for a link elsewhere is refused as well
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "build.log").write_text("TOPSECRET\n")
    (folder / "build.log").unlink()
    folder.rmdir()
    folder.symlink_to(elsewhere)
    resp = client.get(url)
    assert resp.status_code == 404 and "TOPSECRET" not in resp.text


def test_build_log_is_bounded_and_not_a_fifo(client: TestClient, db_session: Session, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "environments" / "def"
    url = _built(db_session, folder)
    os.mkfifo(folder / "build.log")  # opening a FIFO for reading would block the API's worker forever
    assert client.get(url).status_code == 404
    (folder / "build.log").unlink()
    with open(folder / "build.log", "wb") as fh:
        fh.write(b"head\n" + b"x" * (2 * 1024 * 1024) + b"\ntail line\n")
    resp = client.get(url)
    assert resp.status_code == 200 and resp.text.endswith("tail line\n") and len(resp.content) <= 256 * 1024
