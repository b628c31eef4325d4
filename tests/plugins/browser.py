"""Debian's headless Chromium driven by Playwright (never `playwright install`): the `browser` fixture,
`new_page` for any server, and `screenshot`. A pytest plugin (tests/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="module")
def browser():
    """One Chromium per module."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("PARITY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing and PARITY_REQUIRE_BROWSER=1")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


def new_page(browser: Any, base_url: str) -> tuple[Any, Any]:
    """A fresh context and page on base_url; console errors and uncaught exceptions go to page.errors."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.errors = errors  # type: ignore[attr-defined]
    return context, pg


def screenshot(pg: Any, name: str) -> Path:
    """Save a full-page screenshot as a test artifact."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    return path
