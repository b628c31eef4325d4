"""On-call browser tests: their own committed database, a real uvicorn server with reads behind a login."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.core.db import reset_engine
from service.core.settings import get_settings
from tests.dashboard.conftest import app_in_thread, browser  # noqa: F401  (the same Chromium fixture)
from tests.service.scheduler_harness import free_port


@pytest.fixture
def locked_server(committed_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The app in a uvicorn thread with PARITY_READS_REQUIRE_TOKEN=1; -> its base URL."""
    port = free_port()
    monkeypatch.setenv("PARITY_READS_REQUIRE_TOKEN", "1")
    monkeypatch.setenv("PARITY_SESSION_SECRET", "test-session-secret-0123456789")
    monkeypatch.setenv("PARITY_SESSION_MAX_AGE_S", "600")
    monkeypatch.setenv("PARITY_PUBLIC_URL", f"http://127.0.0.1:{port}")
    get_settings.cache_clear()
    reset_engine()
    with app_in_thread(port) as url:
        yield url


@pytest.fixture
def oncall_page(browser, locked_server: str):  # noqa: F811
    """A fresh browser context on the locked server; console errors collected in page.errors."""
    context = browser.new_context(base_url=locked_server, viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.errors = errors  # type: ignore[attr-defined]
    yield pg
    context.close()
