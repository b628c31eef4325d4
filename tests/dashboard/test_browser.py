"""Headless Chromium against a real uvicorn server over the seeded database."""

from __future__ import annotations

from urllib.parse import urljoin, urlparse

import pytest

from tests.plugins.browser import screenshot
from tests.plugins.seed import STEPS, XSS

pytestmark = pytest.mark.browser
CHART_POINTS = "() => Object.fromEntries(Object.entries(window.parityCharts).map(([k, u]) => [k, u.data[0].length]))"


def _open(page, path: str, name: str) -> None:
    response = page.goto(path, wait_until="load")
    assert response is not None and response.status == 200, f"{path}: {response and response.status}"
    page.wait_for_load_state("networkidle")
    screenshot(page, name)
    assert page.errors == [], f"{path}: {page.errors}"


def _same_origin_links(page, server: str) -> set[str]:
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    urls = {urljoin(page.url, h).split("#")[0] for h in hrefs}
    return {u for u in urls if urlparse(u).netloc == urlparse(server).netloc}


def _follow_links(page, server: str, seen: set[str]) -> None:
    for url in sorted(_same_origin_links(page, server) - seen):
        seen.add(url)
        status = page.request.get(url).status
        assert status == 200, f"link {url} from {page.url} answered {status}"


def test_overview(page, server, seeded):
    _open(page, "/", "overview")
    first_row = page.locator("#matrix tbody tr").first
    assert "moe-fp32-router" in first_row.inner_text()  # the regressed config comes first
    regressed = page.locator(f'#matrix td[data-run-id="{seeded.regressed}"]')
    assert "regression" in regressed.inner_text()
    assert "1 fail" in regressed.inner_text() and "2 pass" in regressed.inner_text()
    assert page.locator("#failing tbody tr").count() == 2
    _follow_links(page, server, set())


@pytest.mark.nightly
def test_runs_list_filters_sorts_and_links(page, server, seeded):
    _open(page, "/runs", "runs")
    assert page.locator("#runs tbody tr").count() == seeded.total_runs
    page.select_option("select[name=verdict]", "fail")
    page.click("#filters button[type=submit]")
    page.wait_for_load_state("load")
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 1 and rows.first.get_attribute("data-run-id") == str(seeded.regressed)
    page.goto("/runs")
    page.fill("input[name=label]", "commit=bbb222")
    page.click("#filters button[type=submit]")
    page.wait_for_load_state("load")
    assert [r.get_attribute("data-run-id") for r in page.locator("#runs tbody tr").all()] == [str(seeded.good)]
    page.goto("/runs")
    page.click("#runs thead a:has-text('max |Δloss|')")  # sortable header: largest delta first
    page.wait_for_load_state("load")
    assert "sort=delta" in page.url
    assert page.locator("#runs tbody tr").first.get_attribute("data-run-id") == str(seeded.regressed)
    assert page.errors == []
    page.goto("/runs")
    _follow_links(page, server, set())


def test_run_page_charts(page, server, seeded):
    _open(page, f"/runs/{seeded.regressed}", "run")
    page.wait_for_function("() => window.parityCharts && Object.keys(window.parityCharts).length === 3")
    assert page.evaluate(CHART_POINTS) == {"chart-loss": STEPS, "chart-delta": STEPS, "chart-lr": STEPS}
    assert page.locator("#chart-loss canvas").count() == 1
    assert page.locator("#chart-delta").get_attribute("data-points") == str(STEPS)
    # the |Δloss| axis is logarithmic (uPlot distr 3)
    assert page.evaluate("() => window.parityCharts['chart-delta'].scales.y.distr") == 3
    assert page.locator("#steps tr.divergent").count() == 1
    assert page.locator("#steps tr.mismatch").count() == 2
    assert page.locator("#misaligned tbody tr").count() == 2
    assert "exp_avg" in (page.locator("#fingerprints").text_content() or "")  # raw rows, folded
    assert page.locator("#fingerprint-findings li").count() >= 1  # … under sentences
    # integer step ticks, real labels on the log axis
    steps = page.evaluate("() => window.parityCharts['chart-loss'].axes[0]._values")
    assert steps and all(v is None or v.isdigit() for v in steps), steps
    logs = [v for v in page.evaluate("() => window.parityCharts['chart-delta'].axes[1]._values") if v]
    assert any(v != "0" for v in logs) and logs.count("0") <= 1, logs
    assert "9102" in page.locator("#phase-table").inner_text()
    _follow_links(page, server, set())


def test_triage_page(page, server, seeded):
    _open(page, f"/runs/{seeded.errored}/triage", "triage-error")
    assert "Checkpoint save crashed" in page.locator("#signatures").inner_text()
    assert "AssertionError: shard size mismatch" in page.locator("#logs").inner_text()
    _open(page, f"/runs/{seeded.regressed}/triage", "triage")
    text = page.locator("#signatures").inner_text()
    assert "Optimizer index map points at other params' shards" in text
    assert page.locator("#signatures a.ref[href*='NVIDIA/Megatron-LM/issues/2777']").count() == 1
    changed = page.locator("#package-diff tr.changed").inner_text()
    assert "megatron-core" in changed and "0.16.0" in changed and "0.16.1" in changed
    assert "ccc333" in page.locator("#label-diff tr.changed").inner_text()
    assert "--sharding fully_reshardable" in page.locator("#cmd-local").inner_text()
    _follow_links(page, server, set())


@pytest.mark.nightly
def test_config_history_chart(page, server, seeded):
    _open(page, "/configs/moe-fp32-router", "config")
    page.wait_for_function("() => window.parityCharts && window.parityCharts['chart-history']")
    # one check on one track per trend: the lane with the newest run (one errored run) by default
    assert page.evaluate(CHART_POINTS) == {"chart-history": 1}
    assert page.locator("#verdict-strip a").count() == 1 and page.locator("#lanes tbody tr").count() == 2
    _follow_links(page, server, set())


@pytest.mark.nightly
def test_log_page(page, server, seeded):
    _open(page, f"/runs/{seeded.errored}", "run-errored")
    page.locator("#phase-table a", has_text="log.err").first.click()
    page.wait_for_load_state("load")
    assert page.locator("#log .mark").count() >= 2
    screenshot(page, "log")
    assert page.errors == []


@pytest.mark.nightly
def test_script_label_is_text(page, server, seeded):
    for path in (f"/runs/{seeded.xss}", "/runs", "/configs/dense-bf16"):
        _open(page, path, f"xss-{path.strip('/').replace('/', '-')}")
        assert page.evaluate("() => window.__xss") is None
        assert page.get_by_text(f"branch={XSS}").count() >= 1


@pytest.mark.nightly
def test_signatures_page(page, server):
    _open(page, "/signatures", "signatures")
    assert page.locator("#signature-table tbody tr").count() >= 10
    _follow_links(page, server, set())


def test_pages_read_without_javascript(browser, server, seeded):
    context = browser.new_context(base_url=server, java_script_enabled=False, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"/runs/{seeded.regressed}")
        assert page.locator("#steps tbody tr").count() == STEPS // 2
        assert page.locator("#chart-loss .nojs").is_visible()
        screenshot(page, "run-nojs")
        page.goto("/runs?verdict=fail")
        assert page.locator("#runs tbody tr").count() == 1
    finally:
        context.close()


@pytest.mark.nightly
def test_queued_run_without_metrics_renders_cleanly(page, server, seeded):
    _open(page, f"/runs/{seeded.queued}", "run-queued")
    assert page.evaluate("() => Object.keys(window.parityCharts)") == []
    assert page.locator("#chart-loss .nojs").is_visible()


def test_a_crashed_save_says_the_resume_never_ran(page, server, seeded, database_url):
    # last in this module: it adds the golden known-bad run (Bug A: the save asserts) to the seeded rows
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    from models import Environment
    from tests.plugins.seed import golden_run

    engine = create_engine(database_url)
    with Session(engine) as session:
        # a name of its own: the seeded rows are committed for the whole package, and the golden page
        # tests add an environment "golden" in their own (rolled back) transactions
        env = Environment(name="golden-browser", python="/usr/bin/python3", packages={})
        session.add(env)
        session.flush()
        run_id = golden_run(session, env, "bad").id
        session.commit()
    try:
        _open(page, f"/runs/{run_id}/triage", "triage-bug-a")
        notice = page.locator("#resume-never-ran").inner_text()
        assert "The resume never ran" in notice and "wrong parameter" in notice and "131072" in notice
        _open(page, f"/runs/{run_id}", "run-bug-a")
        assert "the resume never ran" in page.locator("#first-divergent").inner_text()
        assert page.locator("#no-delta").is_visible() and page.locator("#chart-delta").count() == 0
    finally:
        # the seeded rows are committed for the whole package: later tests count them, so take this one out
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM runs WHERE id = :id"), {"id": run_id})
            conn.execute(text("DELETE FROM environments WHERE name = 'golden-browser'"))
        engine.dispose()
