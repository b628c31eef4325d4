"""Suites: versioned check lists (admin), the shipped gate suite, and suite runs with one verdict."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from models import Run
from service.cli.client.ci_report import suite_junit_xml, suite_summary
from service.core.outcome import check_result, of_suite
from service.suites.definitions import MAX_CHECKS, NAME

GATE = Path(__file__).resolve().parents[2] / "suites" / "gate.yaml"
FIX = ["realign-param-index", "restore-adam-step"]
SMALL = {"name": "small", "description": "two checks", "checks": [
    {"name": "dp2-moe", "spec": {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3, "workarounds": FIX}},
    {"name": "layerwise", "spec": {"config": "layerwise-empty-rank", "dp": 2, "steps": 6, "save_step": 3}},
]}


def test_applying_a_suite_versions_it_only_when_it_changes(client: TestClient, make_token) -> None:
    admin = make_token("admin")
    assert client.post("/api/v1/suites", json=SMALL, headers=make_token("submit")).status_code == 403
    first = client.post("/api/v1/suites", json=SMALL, headers=admin)
    assert first.status_code == 201 and first.json()["version"] == 1, first.text
    assert first.json()["checks"][0]["spec"]["dp"] == 2  # stored canonical
    same = client.post("/api/v1/suites", json=SMALL, headers=admin)
    assert same.status_code == 200 and same.json()["version"] == 1
    changed = {**SMALL, "checks": SMALL["checks"][:1]}
    assert client.post("/api/v1/suites", json=changed, headers=admin).json()["version"] == 2
    assert len(client.get("/api/v1/suites/small").json()["checks"]) == 1
    assert len(client.get("/api/v1/suites/small", params={"version": 1}).json()["checks"]) == 2
    assert [s["version"] for s in client.get("/api/v1/suites").json()] == [2]


def test_a_bad_check_is_refused_naming_it(client: TestClient, make_token) -> None:
    admin = make_token("admin")
    bad = {"name": "bad", "checks": [SMALL["checks"][0], {"name": "x", "spec": {"config": "nope"}}]}
    resp = client.post("/api/v1/suites", json=bad, headers=admin)
    assert resp.status_code == 422 and resp.json()["field"].startswith("checks[1]"), resp.text
    twice = {"name": "bad", "checks": [SMALL["checks"][0], SMALL["checks"][0]]}
    assert "twice" in client.post("/api/v1/suites", json=twice, headers=admin).json()["detail"]
    zigzag = {"name": "bad", "checks": [SMALL["checks"][0], {"name": "x", "spec": {
        "config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3, "sharding": "zigzag"}}]}
    resp = client.post("/api/v1/suites", json=zigzag, headers=admin)
    assert resp.status_code == 422 and resp.json()["error"] == "invalid_spec", resp.text
    assert resp.json()["field"] == "checks[1].spec.sharding" and "fully_reshardable" in resp.json()["detail"]


def _ref(prop: dict) -> str:
    return str(prop.get("$ref") or next((r["$ref"] for r in prop.get("allOf", []) if "$ref" in r), ""))


def test_a_suite_runs_json_has_a_schema_with_the_outcome_ci_reads(client: TestClient) -> None:
    """Every suite-run route answers a typed model: the view, its wait and the POST that queues one, and the list."""
    doc = client.get("/openapi.json").json()
    paths, schemas = doc["paths"], doc["components"]["schemas"]

    def ok(path: str, method: str, code: str = "200") -> str:
        return _ref(paths[path][method]["responses"][code]["content"]["application/json"]["schema"])

    for path, method, code in (("/api/v1/suite-runs/{suite_run_id}", "get", "200"),
                               ("/api/v1/suite-runs/{suite_run_id}/wait", "get", "200"),
                               ("/api/v1/suite-runs", "post", "202")):
        assert ok(path, method, code).endswith("/SuiteRunOut"), path
    assert ok("/api/v1/suite-runs", "get").endswith("/SuiteRunPage")
    view = schemas["SuiteRunOut"]["properties"]
    assert _ref(view["outcome"]).endswith("/CiOutcome") and _ref(view["checks"]["items"]).endswith("/SuiteCheckOut")
    assert set(schemas["CiOutcome"]["required"]) == {"result", "exit_code", "exit_code_strict"}
    assert _ref(schemas["SuiteCheckOut"]["properties"]["run"]).endswith("/RunOut")
    assert _ref(schemas["RunOut"]["properties"]["outcome"]).endswith("/CiOutcome")


def test_openapi_states_a_suite_check_through_the_one_check_spec(client: TestClient, make_token) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    checks = schemas["SuiteIn"]["properties"]["checks"]
    assert _ref(checks["items"]).endswith("/SuiteCheck") and (checks["minItems"], checks["maxItems"]) == (1, MAX_CHECKS)
    check = schemas["SuiteCheck"]
    assert check["required"] == ["name", "spec"] and check["additionalProperties"] is False
    assert _ref(check["properties"]["spec"]).endswith("/CheckSpec")  # the same model POST /runs takes
    assert check["properties"]["name"]["pattern"] == NAME.pattern and check["properties"]["why"]["maxLength"] == 1000
    # what the document states is what is enforced: a long why and an odd key are refused, naming the field
    check = {"name": "w", "spec": {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3}}
    long_why = {"name": "w", "checks": [{**check, "why": "x" * 1001}]}
    resp = client.post("/api/v1/suites", json=long_why, headers=make_token("admin"))
    assert resp.status_code == 422 and resp.json()["field"] == "checks.0.why", resp.text
    odd = {"name": "w", "checks": [{**check, "owner": "me"}]}
    resp = client.post("/api/v1/suites", json=odd, headers=make_token("admin"))
    assert resp.status_code == 422 and resp.json()["field"] == "checks.0.owner", resp.text


def test_the_shipped_gate_suite_applies(client: TestClient, make_token) -> None:
    doc = yaml.safe_load(GATE.read_text())
    resp = client.post("/api/v1/suites", json=doc, headers=make_token("admin"))
    assert resp.status_code == 201, resp.text
    specs = {c["name"]: c["spec"] for c in resp.json()["checks"]}
    assert specs["ep2-moe-aux-free"]["ep"] == 2 and specs["pp2-moe-shared-expert"]["pp"] == 2
    assert specs["tp2-dense-bf16"]["tp"] == 2 and specs["dp2-fp16-async-save"]["async_save"] is True
    assert specs["reshard-dp2-to-dp1"]["resume_dp"] == 1
    assert specs["layerwise-dp2"]["config"] == "layerwise-empty-rank"


def test_a_suite_run_queues_every_check_and_adds_up_to_one_verdict(
    client: TestClient, make_token, db_session: Session
) -> None:
    client.post("/api/v1/suites", json=SMALL, headers=make_token("admin"))
    submit = make_token("submit", name="ci")
    # the suite's own labels are the service's: a client's is refused, naming the field (docs/security.md)
    refused = client.post("/api/v1/suite-runs", json={"suite": "small", "labels": {"commit": "abc", "suite": "x"}},
                          headers=submit)
    assert refused.status_code == 422 and refused.json()["field"] == "labels", refused.text
    resp = client.post("/api/v1/suite-runs", json={"suite": "small", "labels": {"commit": "abc"}}, headers=submit)
    assert resp.status_code == 202, resp.text
    view = resp.json()
    assert view["state"] == "running" and view["verdict"] is None and view["counts"]["pending"] == 2
    assert [c["name"] for c in view["checks"]] == ["dp2-moe", "layerwise"]
    run_ids = [c["run"]["id"] for c in view["checks"]]
    labels = view["checks"][0]["run"]["labels"]
    assert labels == {"commit": "abc", "suite": "small", "suite_run": view["id"], "suite_check": "dp2-moe"}
    db_session.execute(update(Run).where(Run.id == run_ids[0]).values(
        state="failed", verdict="fail", signatures=["lr-schedule-mismatch"], first_divergent_step=4))
    db_session.execute(update(Run).where(Run.id == run_ids[1]).values(state="passed", verdict="pass"))
    done = client.get(f"/api/v1/suite-runs/{view['id']}").json()
    assert done["state"] == "finished" and done["verdict"] == "fail", done
    assert done["checks"][0]["cause"] == "Learning rate differs after resume (lr-schedule-mismatch)"
    page = client.get(f"/suite-runs/{view['id']}")
    assert page.status_code == 200 and "lr-schedule-mismatch" in page.text and "/runs/" in page.text
    assert "A pass is advisory when the build is untrusted" in page.text
    junit = ET.fromstring(suite_junit_xml(done, timed_out=False))
    advisory = junit.find("properties/property[@name='advisory']")
    assert advisory is not None and "advisory when the build is untrusted" in (advisory.get("value") or "")
    cases = junit.findall("testcase")
    assert [c.get("name") for c in cases] == ["dp2-moe", "layerwise"] and junit.get("failures") == "1"
    assert "triage: http://testserver/runs/" in (cases[0].find("failure").text or "")  # type: ignore[union-attr]
    summary = suite_summary(done, outcome="fail")
    line = next(x for x in summary.splitlines() if x.startswith("| dp2-moe"))
    assert "**fail**" in line and "| first divergent step 4 |" in line and "(lr-schedule-mismatch)" in line \
        and "/triage)" in line
    assert "_A pass is advisory when the build is untrusted" in summary
    assert client.post("/api/v1/suite-runs", json={"suite": "nope"}, headers=submit).status_code == 404
    assert client.get("/suite-runs/000000000000").status_code == 404


def test_overall_verdict_order_and_the_exit_codes_ci_reads() -> None:
    assert of_suite(["pass", "known-failure"]).model_dump() == {"result": "pass", "exit_code": 0, "exit_code_strict": 1}
    assert of_suite(["pass", "error", "fail"]).model_dump() == {"result": "fail", "exit_code": 1, "exit_code_strict": 1}
    assert of_suite(["pass", "error", "known-failure"]).model_dump() == {
        "result": "error", "exit_code": 2, "exit_code_strict": 2}
    assert of_suite(["pass", "fails-on-base"]).model_dump() == {"result": "pass", "exit_code": 0, "exit_code_strict": 0}
    assert of_suite(["pass", "pending", "fail"]).result == "pending"


@pytest.mark.parametrize(("row", "result"), [
    (("passed", "pass", False, None), "pass"),
    (("failed", "known-failure", False, None), "known-failure"),
    (("failed", "fail", True, None), "fail"),
    (("failed", "fail", False, None), "fail"),  # no history to regress against: still the build's failure
    (("failed", "fail", False, "fails on main too (since abc123)"), "fails-on-base"),
    (("error", "error", False, None), "error"),
    (("error", None, False, None), "error"),  # an infrastructure error: no verdict at all
    (("train_running", None, False, None), "pending"),
])
def test_one_checks_result_is_what_single_runs_and_suites_both_answer(row: tuple, result: str) -> None:
    """`parity submit --config X` and the same check in `--suite` read one result: a failure the base track shares
    exits 0 in both (it once exited 1 alone and 0 in a suite)."""
    assert check_result(*row) == result


def test_a_retried_suite_run_with_the_same_idempotency_key_is_the_same_one(client: TestClient, make_token) -> None:
    client.post("/api/v1/suites", json=SMALL, headers=make_token("admin"))
    submit = {**make_token("submit", name="ci"), "Idempotency-Key": "gha-77-1"}
    body = {"suite": "small", "labels": {"commit": "abc"}}
    first = client.post("/api/v1/suite-runs", json=body, headers=submit)
    again = client.post("/api/v1/suite-runs", json=body, headers=submit)
    assert first.status_code == again.status_code == 202 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["id"] == first.json()["id"]
    assert len(client.get("/api/v1/runs", params={"label": "suite=small"}).json()["items"]) == 2
    changed = client.post("/api/v1/suite-runs", json={**body, "labels": {"commit": "def"}}, headers=submit)
    assert changed.status_code == 409 and changed.json()["field"] == "Idempotency-Key"


def test_suite_runs_are_listed_latest_first_filtered_by_branch_and_suite(client: TestClient, make_token) -> None:
    admin, submit = make_token("admin"), make_token("submit", name="ci")
    client.post("/api/v1/suites", json=SMALL, headers=admin)
    client.post("/api/v1/suites", json={**SMALL, "name": "other"}, headers=admin)
    made = [client.post("/api/v1/suite-runs", json={"suite": suite, "labels": {"branch": branch}},
                        headers=submit).json()["id"]
            for suite, branch in (("small", "main"), ("small", "pr-1"), ("other", "pr-1"), ("small", "pr-2"))]
    listed = client.get("/api/v1/suite-runs")
    assert listed.status_code == 200, listed.text
    assert [i["id"] for i in listed.json()["items"]] == made[::-1] and listed.json()["total"] == 4
    assert [i["id"] for i in client.get("/api/v1/suite-runs", params={"branch": "pr-1"}).json()["items"]] \
        == [made[2], made[1]]
    both = client.get("/api/v1/suite-runs", params={"branch": "pr-1", "suite": "small"}).json()
    assert [i["id"] for i in both["items"]] == [made[1]] and both["items"][0]["labels"] == {"branch": "pr-1"}
    assert both["items"][0]["links"]["dashboard"].endswith(f"/suite-runs/{made[1]}")
    paged = client.get("/api/v1/suite-runs", params={"page_size": 3, "page": 2}).json()
    assert [i["id"] for i in paged["items"]] == [made[0]] and paged["pages"] == 2
    unknown = client.get("/api/v1/suite-runs", params={"suite": "nope"})
    assert unknown.status_code == 404 and unknown.json()["field"] == "suite" and "small" in unknown.json()["detail"]
    prs = client.get("/api/v1/suite-runs", params={"prs": True}).json()  # main is long-lived: not a PR's
    assert [i["labels"]["branch"] for i in prs["items"]] == ["pr-2", "pr-1", "pr-1"]
    bad = client.get("/api/v1/suite-runs", params={"page_size": 0})
    assert bad.status_code == 422 and bad.json()["field"] == "query.page_size"
