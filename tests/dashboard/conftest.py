"""Dashboard fixtures: one seeded, committed database per package; a uvicorn server and Chromium per module."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from models import Base
from service.core.db import reset_engine
from service.core.settings import get_settings
from tests.dashboard.seed import Seeded, seed

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="package")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder the seeded phases wrote their logs into."""
    return tmp_path_factory.mktemp("dashboard") / "runs"


@pytest.fixture(scope="package")
def seeded(database_url: str, run_folder: Path) -> Iterator[Seeded]:
    """Seed the session's database (committed, so a server thread sees it); empty it afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARITY_DATABASE_URL", database_url)
        mp.setenv("PARITY_RUN_FOLDER", str(run_folder))
        mp.setenv("PARITY_DATA_DIR", str(run_folder.parent / "data"))
        mp.setenv("PARITY_PUBLIC_URL", "http://testserver")
        get_settings.cache_clear()
        reset_engine()
        engine = create_engine(database_url)
        with Session(engine) as session:
            ids = seed(session, run_folder)
            session.commit()
        yield ids
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        with engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
        engine.dispose()
        get_settings.cache_clear()
        reset_engine()


@pytest.fixture(scope="package")
def app_client(seeded: Seeded):
    """A TestClient on the real app and the seeded, committed database."""
    from fastapi.testclient import TestClient

    from service.web.app import create_app

    with TestClient(create_app()) as client:
        yield client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def app_in_thread(port: int | None = None) -> Iterator[str]:
    """The app served by a real uvicorn in a thread on a loopback port (a free one by default); -> its base URL."""
    import uvicorn

    from service.web.app import create_app

    port = port or _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
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


@pytest.fixture(scope="module")
def server(seeded: Seeded) -> Iterator[str]:
    """A real uvicorn server in a thread on a free loopback port; -> its base URL."""
    with app_in_thread() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by Playwright (never `playwright install`)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("PARITY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing and PARITY_REQUIRE_BROWSER=1")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture
def page(browser, server: str):
    """A fresh page that records console errors and uncaught exceptions in page.errors."""
    context = browser.new_context(base_url=server, viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.errors = errors  # type: ignore[attr-defined]
    yield pg
    context.close()


def screenshot(pg, name: str) -> Path:
    """Save a full-page screenshot as a test artifact."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    return path
