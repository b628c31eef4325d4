"""The service's check of the contract: golden documents validate, a renamed key is an error naming it,
and stored summaries of older schema versions still read."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jobs.contract import error_record
from jobs.verdict.compare import evaluate
from service.runs.phase_documents import (
    InvalidDocument,
    read_summary,
    validate_phase_document,
    validate_result,
)
from tests.golden import CASES, documents, expected


def _renamable(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Key paths the contract types: top-level keys, probe reports and their fields, step and error fields."""
    paths: list[tuple[Any, ...]] = [(k,) for k in doc]
    paths += [("probes", p) for p in doc["probes"]]
    paths += [("probes", p, f) for p, report in doc["probes"].items() if isinstance(report, dict) for f in report]
    paths += [("steps", 0, f) for f in (doc["steps"][:1] or [{}])[0]]
    paths += [("error", f) for f in (doc.get("error") or {})]
    return paths


def _rename(doc: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[f"{path[-1]}_renamed"] = parent.pop(path[-1])
    return out


CASES_PATHS = [
    (case, phase, path)
    for case in CASES
    for phase, doc in documents(case).items()
    for path in _renamable(dict(doc))
    # optional by design, see below
    if path not in (("error", "rank_errors"), ("error", "ranks"), ("stage_seconds",))
]


@pytest.mark.parametrize("case", CASES)
def test_golden_documents_and_their_results_validate(case: str) -> None:
    docs = documents(case)
    for doc in docs.values():
        assert validate_phase_document(doc) is doc
    validate_result(evaluate(expected(case)["spec"], docs.get("train_and_save"), docs.get("resume")))


def _id(value: Any) -> str:
    return ".".join(map(str, value)) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize(("case", "phase", "path"), CASES_PATHS, ids=_id)
def test_a_renamed_key_never_passes_silently(case: str, phase: str, path: tuple[Any, ...]) -> None:
    docs: dict[str, Any] = dict(documents(case))
    docs[phase] = _rename(docs[phase], path)
    dotted = ".".join(map(str, path))
    try:
        validate_phase_document(docs[phase])
    except InvalidDocument as exc:
        assert exc.field == dotted or exc.field.startswith(dotted + ".") or dotted.startswith(exc.field), str(exc)
        return
    # Probe reports are optional in the type; which ones a phase needs is the spec's: evaluate() says so.
    assert path[0] == "probes" and len(path) == 2, f"{dotted} renamed and nothing noticed"
    r = evaluate(expected(case)["spec"], docs.get("train_and_save"), docs.get("resume"))
    assert r["verdict"] == "error" and r["error"] and f"probes.{path[1]}" in r["error"]["message"]


def test_invalid_document_names_the_field_and_the_allowed_values() -> None:
    doc: dict[str, Any] = dict(documents("good")["resume"])
    doc["phase"] = "resumed"
    with pytest.raises(InvalidDocument) as info:
        validate_phase_document(doc)
    assert info.value.field == "phase" and "'train_and_save', 'resume' or 'uninterrupted'" in str(info.value)


def test_a_version_1_summary_still_reads() -> None:
    # What the service stored before documents had versions: all_ranks, load-under-no-grad, partial errors.
    old_error = {"type": "AssertionError", "message": "boom", "stage": "save", "rank": 1,
                 "all_ranks": [{"type": "AssertionError", "message": "boom", "stage": "save"}]}
    v1 = {"verdict": "fail", "signatures": ["checkpoint-save-crash"], "errors": [old_error], "error": old_error,
          "phases": {"train_and_save": {"status": "error", "error": old_error, "info": {"torch": "2.13.0"},
                                        "workarounds": {"load-under-no-grad": True}}, "resume": None},
          "evidence": {}, "advisories": []}
    s = read_summary(v1)
    assert s["errors"][0]["rank_errors"][0]["message"] == "boom" and "all_ranks" not in s["errors"][0]
    phase = (s.get("phases") or {})["train_and_save"]
    assert phase is not None and phase["workarounds"] == {"load-no-grad": True}
    assert read_summary({}) == {}


def test_an_unreadable_summary_renders_as_an_error_not_a_crash() -> None:
    s = read_summary({"schema_version": 2, "errors": "not a list"})
    assert s == {"errors": [error_record("InvalidDocument", s["errors"][0]["message"], stage="ingest")]}
    assert "errors" in s["errors"][0]["message"]


def test_the_metrics_api_returns_the_jobs_step_and_finding_rows(client, make_token, db_session) -> None:
    """GET /runs/{id}/metrics answers with the contract's StepRow and ProbeFindingRow, less only what the
    tables do not keep: a field the job adds to them reaches the API without a third declaration."""
    from typing import get_type_hints

    from jobs.contract import ProbeFindingRow, StepRow
    from models import ProbeFinding, StepMetric
    from tests.plugins.verdict_helpers import finish

    docs = documents("good")
    result = evaluate(expected("good")["spec"], docs["train_and_save"], docs["resume"])
    resp = client.post("/api/v1/runs", json={"spec": expected("good")["spec"]}, headers=make_token("submit"))
    assert resp.status_code == 202, resp.text
    finish(db_session, resp.json()["id"], result["verdict"], list(result["signatures"]), steps=result["steps"],
           probe_findings=result["probe_findings"])
    metrics = client.get(f"/api/v1/runs/{resp.json()['id']}/metrics").json()
    stored = {c.name for c in StepMetric.__table__.columns}
    step_fields = [k for k in get_type_hints(StepRow) if k in stored]
    assert "num_zeros_resumed" in step_fields and "wall_s_resumed" in step_fields
    assert [list(s) for s in metrics["steps"]] == [step_fields] * len(result["steps"])
    by_step: dict[int, dict[str, Any]] = {s["step"]: dict(s) for s in result["steps"]}
    assert all(s[k] == by_step[s["step"]][k] for s in metrics["steps"] for k in step_fields)
    kept = {c.name for c in ProbeFinding.__table__.columns}
    finding_fields = [k for k in get_type_hints(ProbeFindingRow) if k in kept]
    assert finding_fields == list(get_type_hints(ProbeFindingRow)) and metrics["probes"]
    assert [list(p) for p in metrics["probes"]] == [finding_fields] * len(metrics["probes"])
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert list(schemas["StepMetricOut"]["properties"]) == step_fields
    assert list(schemas["ProbeFindingOut"]["properties"]) == finding_fields
