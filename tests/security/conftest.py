"""Security tests: each shows an attack from the issue failing against the defence that stops it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.core.db import reset_engine
from service.core.settings import get_settings
from service.core.tokens import create_token
from tests.service.scheduler_harness import free_port


@contextmanager
def serve(**options: Any) -> Iterator[str]:
    """The app under a real uvicorn (in a thread, on loopback) with these server options; -> base URL."""
    import uvicorn

    from service.web.app import create_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Set PARITY_* variables and make the service read them again."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    reset_engine()


@pytest.fixture
def tokens(committed_db: str):
    """Committed tokens: tokens(name, *scopes, tracks=("*",)) -> the bearer secret."""
    engine = create_engine(committed_db)

    def _make(name: str, *scopes: str, tracks: tuple[str, ...] = ("*",)) -> str:
        with Session(engine) as session:
            secret = create_token(session, name=name, scopes=list(scopes), tracks=list(tracks))
            session.commit()
        return secret

    yield _make
    engine.dispose()
