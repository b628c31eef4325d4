"""/suite-runs: every suite run, newest first, with its verdict, suite, build and counts (hostile names escaped)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, delete
from sqlalchemy.orm import Session

from models import Suite, SuiteRun
from models.base import utcnow
from tests.plugins.seed import XSS, Seeded


@pytest.fixture
def suite_runs(database_url: str, seeded: Seeded) -> Iterator[dict[str, str]]:
    """Two suite runs over the seeded runs (no new runs: other tests count them); removed afterwards."""
    engine = create_engine(database_url)
    now = utcnow()
    with Session(engine) as session:
        suite = Suite(name=XSS, version=3, checks=[{"name": "c", "spec": {}}], description="")
        session.add(suite)
        session.flush()
        old = SuiteRun(id="sr0000000old", suite_id=suite.id, environment=f"build-{XSS}", labels={}, requester="ci",
                       runs=[{"name": "good", "run_id": seeded.good}], created_at=now - timedelta(hours=2))
        new = SuiteRun(id="sr0000000new", suite_id=suite.id, environment="build-abc", labels={}, requester=XSS,
                       runs=[{"name": "good", "run_id": seeded.good}, {"name": "bad", "run_id": seeded.regressed},
                             {"name": "waiting", "run_id": seeded.queued}], created_at=now - timedelta(hours=1))
        done = SuiteRun(id="sr00000fail0", suite_id=suite.id, environment="build-abc", labels={}, requester="ci",
                        runs=[{"name": "good", "run_id": seeded.good}, {"name": "bad", "run_id": seeded.regressed}],
                        created_at=now - timedelta(minutes=30))
        session.add_all([old, new, done])
        session.commit()
        suite_id = suite.id
    yield {"old": "sr0000000old", "new": "sr0000000new", "done": "sr00000fail0"}
    with Session(engine) as session:
        session.execute(delete(SuiteRun).where(SuiteRun.suite_id == suite_id))
        session.execute(delete(Suite).where(Suite.id == suite_id))
        session.commit()
    engine.dispose()


def test_suite_runs_list_newest_first_with_verdicts_and_links(app_client, suite_runs) -> None:
    page = app_client.get("/suite-runs")
    assert page.status_code == 200, page.text
    assert '<a href="/suite-runs">Suite runs</a>' in page.text  # in the nav of every page
    assert '<a href="/suite-runs">Suite runs</a>' in app_client.get("/runs").text
    rows = re.findall(r'<tr data-suite-run-id="(\w+)">(.*?)</tr>', page.text, re.S)
    assert [r[0] for r in rows] == [suite_runs["done"], suite_runs["new"], suite_runs["old"]]
    by_id = dict(rows)
    assert f'href="/suite-runs/{suite_runs["done"]}"' in by_id[suite_runs["done"]]
    # a regressed check fails the suite; a queued one leaves it running; the good one alone passes
    assert "v-fail" in by_id[suite_runs["done"]] and "2 check(s) · 1 pass · 1 fail" in by_id[suite_runs["done"]]
    assert "s-running" in by_id[suite_runs["new"]] and "1 pending" in by_id[suite_runs["new"]]
    assert "v-pass" in by_id[suite_runs["old"]]
    assert "v3" in by_id[suite_runs["old"]] and "build-abc" in by_id[suite_runs["new"]]
    assert "3 suite run(s)" in page.text
    # the detail page the list links to exists
    assert app_client.get(f"/suite-runs/{suite_runs['done']}").status_code == 200


def test_suite_runs_list_escapes_hostile_names(app_client, suite_runs) -> None:
    page = app_client.get("/suite-runs").text
    assert XSS not in page  # suite name, build name and requester are all the hostile string
    assert page.count(html.escape(XSS)) >= 3


@pytest.mark.parametrize("page", ["0", "-5", "99999999999999999999999", "2"])
def test_suite_runs_list_clamps_odd_pages(app_client, suite_runs, page: str) -> None:
    r = app_client.get(f"/suite-runs?page={page}")  # clamped to the one page there is: never a 500 or an empty page
    assert r.status_code == 200 and r.text.count("data-suite-run-id=") == 3


def test_suite_runs_list_when_empty(app_client, seeded) -> None:
    page = app_client.get("/suite-runs")
    assert page.status_code == 200 and "No suite runs yet." in page.text
