"""Dashboard fixtures: one seeded, committed database per package and the app served per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from models import Base
from service.core.db import reset_engine
from service.core.settings import get_settings
from tests.plugins.browser import new_page
from tests.plugins.seed import Seeded, seed
from tests.plugins.server import serve


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


@pytest.fixture(scope="module")
def server(seeded: Seeded) -> Iterator[str]:
    """A real uvicorn server in a thread on a free loopback port; -> its base URL."""
    with serve() as url:
        yield url


@pytest.fixture
def page(browser, server: str):
    """A fresh page that records console errors and uncaught exceptions in page.errors."""
    context, pg = new_page(browser, server)
    yield pg
    context.close()

