"""A run with a parallel layout (tp / ep beside dp) shows it on its run page and reproduces with it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, delete, select
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from models import Environment, Run
from service.web.dashboard.reproduce import local_command
from tests.plugins.seed import Seeded, _run, spec


@pytest.fixture
def layout_run(database_url: str, seeded: Seeded) -> Iterator[int]:
    """One extra committed run at dp 2, ep 2 (removed again, so the seeded counts hold)."""
    engine = create_engine(database_url)
    with Session(engine) as session:
        env = session.scalar(select(Environment).where(Environment.name == "default"))
        assert env is not None
        run = _run(session, env, age_h=0.5, spec=spec(ep=2))
        session.commit()
        run_id = run.id
    yield run_id
    with Session(engine) as session:
        session.execute(delete(Run).where(Run.id == run_id))
        session.commit()
    engine.dispose()


def test_run_page_shows_the_layout(app_client, layout_run: int) -> None:
    assert RunSpec.from_dict(spec(ep=2)).world_size == 2
    text = app_client.get(f"/runs/{layout_run}").text
    assert '<dd id="layout">dp=2 tp=1 pp=1 ep=2 · 2 rank(s), expert data-parallel 1</dd>' in text
    assert "moe-fp32-router dp=2 ep=2 M=" in text  # the spec summary names the non-default sizes


def test_run_page_of_a_dp_only_run_shows_the_default_layout(app_client, seeded: Seeded) -> None:
    text = app_client.get(f"/runs/{seeded.good}").text
    assert '<dd id="layout">dp=2 tp=1 pp=1 ep=1 · 2 rank(s)</dd>' in text


def test_reproduce_commands_carry_the_layout() -> None:
    assert "--tp 2" in local_command(spec(tp=2)) and "--ep 2" in local_command(spec(ep=2))
    # every field spelled out, defaults included: a default changing later cannot change the repro
    assert "--tp 1" in local_command(spec()) and "--ep 1" in local_command(spec())
