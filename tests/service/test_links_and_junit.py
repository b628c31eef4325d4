"""Links honour PARITY_PUBLIC_URL (else the request's host); JUnit and `parity submit` exit codes per verdict."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.cli.client.ci_report import junit_xml
from service.cli.client.submit import report
from service.core.outcome import check_result, of_result
from service.core.settings import get_settings
from service.core.verdicts import reading

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4}


@pytest.fixture
def unset_public_url(monkeypatch: pytest.MonkeyPatch, db_session: Session) -> Iterator[None]:
    monkeypatch.delenv("PARITY_PUBLIC_URL")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_links_use_the_request_host_without_a_public_url(unset_public_url, client: TestClient, make_token) -> None:
    run = client.post("/api/v1/runs", json={"spec": SPEC}, headers=make_token("submit"),
                      ).json()
    assert run["links"]["triage"] == f"http://testserver/runs/{run['id']}/triage"
    other = client.get(f"/api/v1/runs/{run['id']}", headers={"Host": "parity.example.org:8443"}).json()
    assert other["links"]["dashboard"] == f"http://parity.example.org:8443/runs/{run['id']}"


def test_links_use_the_public_url_when_set(client: TestClient, make_token, monkeypatch) -> None:
    monkeypatch.setenv("PARITY_PUBLIC_URL", "https://parity.example.com/")
    get_settings.cache_clear()
    run = client.post("/api/v1/runs", json={"spec": SPEC}, headers=make_token("submit")).json()
    fetched = client.get(f"/api/v1/runs/{run['id']}", headers={"Host": "internal:8000"}).json()
    assert fetched["links"]["triage"] == f"https://parity.example.com/runs/{run['id']}/triage"
    assert fetched["links"]["self"] == f"https://parity.example.com/api/v1/runs/{run['id']}"


def _doc(verdict: str, **extra) -> dict:
    known = [{"id": 1, "signature": "s", "link": "https://github.com/x/y/issues/1"}]
    doc = {"id": 7, "config": "moe-fp32-router", "state": "failed", "verdict": verdict, "signatures": ["s"],
           "regression": False, "links": {"triage": "https://parity.example.com/runs/7/triage"},
           "known_failures": known, "summary": {"known_failures": known}, **extra}
    outcome = of_result(check_result(doc["state"], verdict, bool(doc["regression"]), None)).model_dump()
    return {**doc, "reading": reading(doc).to_dict(), "outcome": outcome}  # what the service sends


class _NoMetrics:
    def get(self, _path: str):
        class R:
            is_success, status_code = True, 200  # what submit's get_json checks before trusting the body

            def json(self) -> dict:
                return {"steps": []}
        return R()


def test_known_failure_exits_zero_unless_strict(tmp_path, capsys) -> None:
    junit = tmp_path / "j.xml"
    assert report(_NoMetrics(), _doc("known-failure"), timed_out=False, junit=junit) == 0  # type: ignore[arg-type]
    assert "known upstream bug: s https://github.com/x/y/issues/1" in capsys.readouterr().out
    case = ET.parse(junit).getroot().find("testcase")
    assert case is not None and case.find("skipped") is not None and case.find("failure") is None
    assert report(_NoMetrics(), _doc("known-failure"), timed_out=False, junit=junit, strict=True) == 1  # type: ignore[arg-type]
    failure = ET.parse(junit).getroot().find("testcase/failure")
    assert failure is not None and "https://parity.example.com/runs/7/triage" in (failure.text or "")


def test_junit_failure_carries_the_triage_link() -> None:
    root = ET.fromstring(junit_xml(_doc("fail", regression=True, track="pr-1", compared_track="main"),
                                   timed_out=False))
    failure = root.find("testcase/failure")
    assert failure is not None and "triage: https://parity.example.com/runs/7/triage" in (failure.text or "")
    assert "fail (regression against main)" in (failure.text or "")
    advisory = root.find("properties/property[@name='advisory']")  # a pass on untrusted code is advisory
    assert advisory is not None and "can write its own results" in (advisory.get("value") or "")
