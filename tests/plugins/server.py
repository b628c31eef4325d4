"""The one way tests serve the app: a real uvicorn in a thread on a loopback port.

In-process (a thread, not a subprocess) so a test can reach into the app's process — slow its commits,
swap its settings — while a real HTTP client talks to it. Registered as a pytest plugin (tests/conftest.py),
so `live_api` is a fixture everywhere."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from service.core.db import reset_engine
from service.core.settings import get_settings

START_DEADLINE_S = 30


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(port: int | None = None, **options: Any) -> Iterator[str]:
    """The app under a real uvicorn (in a thread, on loopback) with these server options; -> base URL."""
    import uvicorn

    from service.web.app import create_app

    port = port or free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_DEADLINE_S
    while not srv.started:  # a condition with a deadline: uvicorn sets `started` once it listens
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(START_DEADLINE_S)


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Set PARITY_* variables and make the service read them again."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    reset_engine()


@pytest.fixture
def live_api(committed_db: str) -> Iterator[str]:
    """The app on the committed test database behind a real uvicorn in this process; -> its URL."""
    with serve() as url:
        yield url
