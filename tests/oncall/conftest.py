"""On-call browser tests: their own committed database, a real uvicorn server with reads behind a login."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.core.db import reset_engine
from service.core.settings import get_settings
from tests.plugins.browser import new_page
from tests.plugins.server import free_port, serve


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
    with serve(port) as url:
        yield url


@pytest.fixture
def oncall_page(browser, locked_server: str):
    """A fresh browser context on the locked server; console errors collected in page.errors."""
    context, pg = new_page(browser, locked_server)
    yield pg
    context.close()
