"""Every dashboard page through TestClient over the seeded database (fast; no browser)."""

from __future__ import annotations

import html
import json
import re

from service.web.dashboard import runlist
from tests.plugins.seed import STEPS, XSS


def _chart_json(html: str, element_id: str) -> dict:
    match = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', html, re.S)
    assert match, f"no {element_id} block"
    return json.loads(match.group(1))


def _run_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-run-id="(\d+)"', html)]


def test_overview_lists_regressions_first(app_client, seeded):
    r = app_client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    matrix = r.text[r.text.index('id="matrix"'):]
    assert matrix.index("moe-fp32-router") < matrix.index("dense-bf16")
    assert f'data-run-id="{seeded.regressed}"' in matrix and "is-regression" in matrix
    assert "2 pass" in matrix and "1 queued" in r.text
    # a pass that needed a workaround is its own verdict and says what the workaround hid
    assert "pass (worked around: restore-adam-step)" in matrix
    assert "passes only with workaround restore-adam-step, which hides adam-step-not-restored" in matrix
    # a regressed cell reads as the run's own label does (the API's verdict_label, the run page, JUnit)
    shown = app_client.get(f"/api/v1/runs/{seeded.regressed}").json()["verdict_label"]
    assert "(regression" in shown and f">{html.escape(shown)}</a>" in matrix


def test_runs_list_filters(app_client, seeded):
    assert len(_run_ids(app_client.get("/runs").text)) == seeded.total_runs
    assert _run_ids(app_client.get("/runs?verdict=fail").text) == [seeded.regressed]
    assert _run_ids(app_client.get("/runs?regression=yes").text) == [seeded.regressed]
    assert _run_ids(app_client.get("/runs?label=commit%3Dbbb222").text) == [seeded.good]
    assert set(_run_ids(app_client.get("/runs?environment=mcore-main").text)) == {seeded.errored, seeded.xss}
    assert _run_ids(app_client.get("/runs?config=dense-bf16&environment=default").text) == [seeded.dense]
    assert _run_ids(app_client.get("/runs?since=2999-01-01").text) == []
    assert _run_ids(app_client.get("/runs?state=queued").text) == [seeded.queued]


def test_runs_list_sorts_and_reports_bad_filters(app_client, seeded):
    assert _run_ids(app_client.get("/runs?sort=delta&dir=desc").text)[0] == seeded.regressed
    ascending = _run_ids(app_client.get("/runs?sort=id&dir=asc").text)
    assert ascending == sorted(ascending)
    r = app_client.get("/runs?verdict=maybe&label=nokey&sort=nope")
    assert r.status_code == 200
    assert "Ignored verdict" in r.text and "Ignored label" in r.text and "Ignored sort" in r.text
    assert len(_run_ids(r.text)) == seeded.total_runs


def test_runs_list_paginates_in_sql(app_client, seeded):
    from service.core.db import session_scope

    query = runlist.parse_query({"sort": ["id"], "dir": ["asc"], "page": ["3"]})
    with session_scope() as session:
        page = runlist.page_of_runs(session, query, per_page=3)
        assert (page.total, page.pages, page.page) == (seeded.total_runs, 3, 3)
        assert [r.id for r in page.runs] == [seeded.queued]
    assert "page=2" in query.url(page=2) and "sort=id" in query.url()


def test_run_page_chart_data(app_client, seeded):
    r = app_client.get(f"/runs/{seeded.regressed}")
    assert r.status_code == 200
    data = _chart_json(r.text, "run-chart-data")
    assert len(data["steps"]) == STEPS and len(data["abs_delta"]) == STEPS
    assert data["loss_resumed"][:10] == [None] * 10
    assert [m["kind"] for m in data["markers"]] == ["save", "diverge"]
    assert [m["kind"] for m in data["delta_markers"]] == ["save", "diverge", "beyond"]
    # the lr lane is marked only where the lr itself differs, not at the loss's divergence
    assert [m["label"].split(" @")[0] for m in data["lr_markers"]] == ["save", "lr differs"]
    assert sum(v is not None for v in data["lr_mismatch"]) == 2
    assert all(t is None for t in data["tolerance"][:10]) and all(t for t in data["tolerance"][10:])
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in r.text  # misaligned param's shard holder
    assert "9102" in r.text and "train_submitted" in r.text
    assert '<dd id="isolation">process: one job' in r.text  # which isolation ran is on the page


def test_bit_exact_run_plots_zeros_on_the_floor(app_client, seeded):
    data = _chart_json(app_client.get(f"/runs/{seeded.good}").text, "run-chart-data")
    assert set(data["abs_delta"][10:]) == {data["floor"]}


def test_missing_run_is_an_html_404(app_client):
    r = app_client.get("/runs/999999")
    assert r.status_code == 404 and "run 999999 does not exist" in r.text


def test_triage_page(app_client, seeded):
    r = app_client.get(f"/runs/{seeded.regressed}/triage")
    assert r.status_code == 200
    assert "Optimizer index map points at other params&#39; shards" in r.text
    assert 'href="https://github.com/NVIDIA/Megatron-LM/issues/2777"' in r.text
    assert f'href="/runs/{seeded.good}"' in r.text
    assert ("parity run-local --environment default --config moe-fp32-router --dp 2 --steps 20 --save-step 10 "
            "--sharding fully_reshardable --seed 1234 --tolerance default") in r.text
    assert "parity submit --config moe-fp32-router" in r.text and "--label commit=ccc333" in r.text
    errored = app_client.get(f"/runs/{seeded.errored}/triage").text
    assert "Checkpoint save crashed" in errored and "around the last traceback" in errored
    assert "This check has never passed on track <code>main</code>" in errored


def test_triage_of_a_passing_run_says_so(app_client, seeded):
    r = app_client.get(f"/runs/{seeded.good}/triage")
    assert r.status_code == 200 and "nothing to triage" in r.text


def test_config_history(app_client, seeded):
    r = app_client.get("/configs/moe-fp32-router")
    assert r.status_code == 200
    # one lane per check × track, and the trend of one lane only (never a mix of checks or tracks)
    assert r.text.count("<tr", r.text.index('id="lanes"'), r.text.index('id="verdict-strip"')) == 3
    chart = _chart_json(r.text, "history-data")
    assert chart["ids"] == [seeded.errored]  # default: the lane with the newest run
    other = re.search(r'href="(/configs/moe-fp32-router\?check=[0-9a-f]+&amp;track=main)">chart this', r.text)
    assert other
    chart = _chart_json(app_client.get(html.unescape(other.group(1))).text, "history-data")
    assert len(chart["x"]) == 3 and chart["x"] == sorted(chart["x"])
    assert sum(v is not None for v in chart["fail"]) == 1
    only_main = _chart_json(app_client.get("/configs/moe-fp32-router?environment=mcore-main").text, "history-data")
    assert only_main["ids"] == [seeded.errored]
    assert app_client.get("/configs/no-such-config").status_code == 404


def test_signatures_page(app_client):
    r = app_client.get("/signatures")
    assert r.status_code == 200 and "optimizer-index-misalignment" in r.text


def test_script_label_is_escaped_everywhere(app_client, seeded):
    escaped = "&lt;script&gt;window.__xss = 1&lt;/script&gt;"
    for path in (f"/runs/{seeded.xss}", "/runs", "/configs/dense-bf16", f"/runs/{seeded.xss}/triage"):
        html = app_client.get(path).text
        assert XSS not in html, path
    assert escaped in app_client.get(f"/runs/{seeded.xss}").text


def test_static_assets_are_served(app_client):
    for path in ("/static/dashboard/vendor/uPlot.iife.min.js", "/static/dashboard/vendor/uPlot.min.css",
                 "/static/dashboard/dashboard.js", "/static/dashboard/dashboard.css"):
        assert app_client.get(path).status_code == 200, path
