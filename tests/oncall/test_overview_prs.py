"""The overview under a real PR flow: 200 pull-request branches each ran the gate suite. The matrix keeps the
long-lived tracks as columns (main, a release branch); the PRs are a list of suite runs, latest first, filterable;
a check is shown by its suite check name with the spec below and on hover."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from models import Environment, Run, Suite, SuiteRun
from tests.plugins.browser import screenshot
from tests.plugins.server import serve

PRS = 200
SPEC = {"steps": 6, "save_step": 3, "seed": 1234, "tolerance": "default", "isolation": "process", "workarounds": []}
CHECKS = {  # suite check name -> spec: the same preset four times over, as the gate has it
    "dp2-moe-fp32-router": {"config": "moe-fp32-router", "dp": 2, "sharding": "dp_reshardable"},
    "ep2-moe-fp32-router": {"config": "moe-fp32-router", "dp": 2, "ep": 2, "sharding": "dp_reshardable"},
    "pp2-moe-fp32-router": {"config": "moe-fp32-router", "dp": 2, "pp": 2, "sharding": "dp_reshardable"},
    "reshard-dp2-to-dp1": {"config": "moe-fp32-router", "dp": 2, "resume_dp": 1, "sharding": "dp_reshardable"},
}


def _suite_run(session: Session, suite: Suite, env: Environment, labels: dict[str, str], at: datetime,
               failing: set[str], n: int) -> None:
    runs = []
    for name, spec in CHECKS.items():
        bad = name in failing
        run = Run(environment_id=env.id, config=spec["config"], spec={**SPEC, **spec},
                  state="failed" if bad else "passed", verdict="fail" if bad else "pass",
                  signatures=["lr-schedule-mismatch"] if bad else [],
                  first_divergent_step=4 if bad else None, labels={**labels, "suite": "gate",
                  "suite_run": f"{n:012x}", "suite_check": name}, summary={}, created_at=at, updated_at=at,
                  finished_at=at + timedelta(minutes=3))
        session.add(run)
        session.flush()
        runs.append({"name": name, "run_id": run.id})
    session.add(SuiteRun(id=f"{n:012x}", suite_id=suite.id, environment=env.name, labels=labels, requester="ci",
                         runs=runs, created_at=at))


@pytest.fixture
def pr_flow(committed_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """main and core_r0.16.0 nightly, then 200 PR branches' gate runs (every 7th failing a check); -> URL."""
    from service.core.db import reset_engine
    from service.core.settings import get_settings

    monkeypatch.setenv("PARITY_PUBLIC_URL", "http://testserver")
    get_settings.cache_clear()
    reset_engine()
    engine = create_engine(committed_db)
    now = datetime.now(UTC)
    with Session(engine) as session:
        env = Environment(name="mcore-0.16.1", python="/usr/bin/python3", packages={}, state="ready",
                          megatron_core="0.16.1")
        session.add(env)
        suite = Suite(name="gate", version=1, description="",
                      checks=[{"name": n, "spec": s} for n, s in CHECKS.items()])
        session.add(suite)
        session.flush()
        _suite_run(session, suite, env, {"branch": "main"}, now - timedelta(days=1), set(), 1)
        _suite_run(session, suite, env, {"branch": "core_r0.16.0"}, now - timedelta(days=1), set(), 2)
        for i in range(PRS):
            labels = {"branch": f"pr-{1000 + i}", "base_branch": "main", "commit": f"{i:07x}abcdef",
                      "pipeline_url": f"https://ci.example.com/pipelines/{5000 + i}"}
            failing = {"ep2-moe-fp32-router"} if i % 7 == 0 else set()
            _suite_run(session, suite, env, labels, now - timedelta(minutes=PRS - i), failing, 10 + i)
        session.commit()
    engine.dispose()
    with serve() as url:
        yield url


def test_pr_tracks_are_a_list_and_long_lived_tracks_the_columns(pr_flow: str, browser) -> None:  # noqa: F811
    import httpx

    page = html.unescape(httpx.get(pr_flow + "/", timeout=30).text)
    matrix = page[page.index('id="matrix"'):]
    assert re.findall(r"<th>([^<]+)</th>", matrix[:matrix.index("</thead>")]) == ["Check", "core_r0.16.0", "main"]
    names = re.findall(r'<span class="check-name">([^<]+)</span>', matrix)
    assert sorted(names) == sorted(CHECKS)  # the suite's names, not moe-fp32-router four times over
    assert "200 pull-request branch(es)" in page
    prs = page[page.index('id="pr-suite-runs"'):page.index("</table>", page.index('id="pr-suite-runs"'))]
    branches = re.findall(r'href="/suite-runs\?branch=(pr-\d+)"', prs)
    assert branches == [f"pr-{1000 + i}" for i in range(PRS - 1, PRS - 21, -1)]  # the latest 20, latest first
    assert 'href="https://ci.example.com/pipelines/5199"' in prs
    listed = html.unescape(httpx.get(pr_flow + "/suite-runs", params={"prs": "only", "branch": "pr-1007"}).text)
    assert listed.count("data-suite-run-id=") == 1 and "pr-1007" in listed
    assert "main" not in re.findall(r'href="/suite-runs\?branch=([^"]+)"',
                                    html.unescape(httpx.get(pr_flow + "/suite-runs?prs=only").text))
    context = browser.new_context(base_url=pr_flow, viewport={"width": 1400, "height": 900})
    try:
        view = context.new_page()
        view.goto("/")
        assert view.locator("#matrix thead th").count() == 3
        path = screenshot(view, "overview-200-prs")
        assert path.stat().st_size > 10_000
    finally:
        context.close()
