"""Start-up: embedded Postgres when no URL is given, and one-line errors for bad configuration."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.plugins.scheduler_harness import free_port

PARITY = [sys.executable, "-m", "service.cli.main"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
    env.update(PARITY_DATA_DIR=str(tmp_path / "data"), PARITY_EXECUTOR="local", **extra)
    return env



def _serve(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    log = open(tmp_path / f"serve-{port}.log", "wb")
    return subprocess.Popen([*PARITY, "serve", "--port", str(port)], env=_env(tmp_path), stdout=log, stderr=log)


def _wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "parity serve exited early"
        try:
            resp = httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=2)
            return resp.json()
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError("service did not become healthy")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


@pytest.mark.slow
def test_embedded_postgres_is_real_and_persists_across_restart(tmp_path: Path) -> None:
    port = free_port()
    first = _serve(tmp_path, port)
    try:
        health = _wait_health(port, first)
        assert health["database"]["ok"] is True
        assert health["database"]["server_version"].split(".")[0].isdigit()
        token = subprocess.run(
            [*PARITY, "token", "create", "--name", "persist", "--scope", "admin"],
            env=_env(tmp_path), capture_output=True, text=True, check=True,
        ).stdout.strip()
        created = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/environments",
            json={"name": "kept", "python": sys.executable},
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,  # registration imports torch + megatron.core in that python to check it
        )
        assert created.status_code == 201, created.text
    finally:
        _stop(first)
    assert (tmp_path / "data" / "pgdata" / "PG_VERSION").exists()

    second = _serve(tmp_path, port)
    try:
        _wait_health(port, second)
        names = [e["name"] for e in httpx.get(f"http://127.0.0.1:{port}/api/v1/environments").json()]
        assert "kept" in names
    finally:
        _stop(second)
        _stop_embedded_postgres(tmp_path / "data" / "pgdata")


def _stop_embedded_postgres(pgdata: Path) -> None:
    """The embedded server outlives `parity serve` on purpose (reused on restart); the test stops it."""
    pid_file = pgdata / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGINT)  # fast shutdown


@pytest.mark.parametrize(
    ("extra", "setting"),
    [
        ({"PARITY_EXECUTOR": "kubernetes"}, "PARITY_EXECUTOR"),
        ({"PARITY_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}, "PARITY_DATABASE_URL"),
        ({"PARITY_DATABASE_URL": "mysql://root@127.0.0.1/x"}, "PARITY_DATABASE_URL"),
        ({"PARITY_LONG_LIVED_TRACKS": "main,release[0-9]"}, "PARITY_LONG_LIVED_TRACKS"),
    ],
)
def test_bad_configuration_is_one_clear_line(tmp_path: Path, extra: dict[str, str], setting: str) -> None:
    env = _env(tmp_path)
    env.update(extra)
    done = subprocess.run([*PARITY, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert setting in lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.nightly
@pytest.mark.slow
def test_the_demo_stops_the_embedded_postgres_it_started(tmp_path: Path) -> None:
    from service.core.db import embedded_postgres_running, start_embedded_postgres, stop_embedded_postgres

    data = tmp_path / "data"
    assert not embedded_postgres_running(data)  # so `parity demo` knows the server is its own
    try:
        start_embedded_postgres(data)
        assert embedded_postgres_running(data)
        assert stop_embedded_postgres(data) is True
        assert not embedded_postgres_running(data) and (data / "pgdata" / "PG_VERSION").exists()  # data kept
    finally:
        _stop_embedded_postgres(data / "pgdata")
