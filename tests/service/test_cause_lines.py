"""What a resume lost reaches every surface: a run ingested from real documents of a lossy moment load
(tests/golden/causes/wrong) reads the verdict's cause line in the API's reading, the `parity submit --wait`
line, the JUnit failure message, the Markdown summary and the triage page."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from models import Environment
from service.cli.client.ci_report import junit_xml, run_summary
from service.cli.client.submit import report
from tests.plugins.seed import golden_run


class _NoMetrics:
    def get(self, _path: str) -> Any:
        class R:
            is_success, status_code = True, 200

            def json(self) -> dict[str, Any]:
                return {"steps": []}
        return R()


@pytest.fixture
def lossy(client: TestClient, db_session: Session) -> tuple[dict[str, Any], str]:
    """(the run as GET /api/v1/runs/{id} answers, the cause line the verdict stored)."""
    env = Environment(name="golden", python="/usr/bin/python3", packages={})
    db_session.add(env)
    db_session.flush()
    run = golden_run(db_session, env, "causes/wrong")
    line = run.summary["cause_lines"]["optimizer-moments-mismatch"]
    assert line.startswith("optimizer-moments-mismatch: moments decoder.") and "/exp_avg_sq loaded wrong (rank 0; +" \
        in line
    return dict(client.get(f"/api/v1/runs/{run.id}").json()), line


def test_the_reading_and_the_cli_line_name_the_lost_tensor(lossy: tuple[dict[str, Any], str], capsys) -> None:
    doc, line = lossy
    assert doc["reading"]["cause"] == line
    assert report(_NoMetrics(), doc, timed_out=False, junit=None) == 1  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines()[0] == f"verdict: fail — {line}; first divergent step 4"


def test_junit_and_the_summary_name_the_lost_tensor(lossy: tuple[dict[str, Any], str]) -> None:
    doc, line = lossy
    failure = ET.fromstring(junit_xml(doc, timed_out=False)).find("testcase/failure")
    assert failure is not None and failure.get("message") == line
    assert f"cause: {line}\n" in (failure.text or "")
    assert f"| first divergent step 4 | {line} | [triage](" in run_summary(doc, outcome="fail")


def test_the_triage_page_names_the_lost_tensor(client: TestClient, lossy: tuple[dict[str, Any], str]) -> None:
    doc, line = lossy
    page = html.unescape(client.get(f"/runs/{doc['id']}/triage").text)
    assert f'<p class="cause-line"><code>{line}</code></p>' in page
    assert f'<span class="reading">{line}; first divergent step 4</span>' in page
    # the finding sentence counts each tensor once (the classified `lost` rows repeat the evidence's items)
    assert f"  - `{line}`" in page  # the copy-as-issue Markdown, under its signature
    assert "Optimizer moments not restored: 12 tensors on rank 0 (20 differences in all) — " in page
