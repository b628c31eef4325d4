"""evaluate() on the golden documents of a real DP 2 run: the known-bad build is flagged, the known-good passes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.launch.local import format_step_table
from jobs.verdict.compare import evaluate
from tests.golden import CASES, documents, expected


def _evaluate(case: str) -> dict[str, Any]:
    docs = documents(case)
    return dict(evaluate(expected(case)["spec"], docs.get("train_and_save"), docs.get("resume")))


@pytest.mark.parametrize("case", CASES)
def test_evaluate_reproduces_the_captured_verdict(case: str) -> None:
    want = {k: v for k, v in expected(case).items() if k != "spec"}
    got = _evaluate(case)
    assert {k: got[k] for k in want} == want
    json.dumps(got)
    assert f"verdict: {want['verdict']}" in format_step_table(got)  # type: ignore[arg-type]


def test_known_bad_save_crash_is_explained_by_the_misaligned_index_map() -> None:
    r = _evaluate("bad")
    assert r["verdict"] == "fail"
    assert r["signatures"][:2] == ["checkpoint-save-crash", "optimizer-index-misalignment"]
    assert r["error"]["stage"] == "save" and r["error"]["type"] == "AssertionError"
    assert [e["rank"] for e in r["error"]["rank_errors"]] == [0, 1]
    evidence = r["evidence"]["optimizer-index-misalignment"]
    assert evidence["misaligned_total"] == 24 and {e["rank"] for e in evidence["per_rank"]} == {0, 1}
    assert any(f["probe"] == "index_map" and not f["ok"] and f["param_name"] for f in r["probe_findings"])


def test_known_good_resumes_bit_identically() -> None:
    r = _evaluate("good")
    assert r["verdict"] == "pass" and r["signatures"] == [] and r["errors"] == []
    assert r["lanes"]["exact"]["pass"] and r["first_divergent_step"] is None
    assert r["worked_around"] == ["optimizer-index-misalignment", "adam-step-not-restored", "fp32-view-inplace-load"]
    assert r["lanes"]["final_state"]["measured"] and all(
        s["differing"] == 0 for s in r["lanes"]["final_state"]["sections"].values()
    )
    resumed = [s for s in r["steps"] if s["resumed_phase"]]
    assert [s["step"] for s in resumed] == [4, 5, 6] and all(s["loss_abs_delta"] == 0.0 for s in resumed)
    assert all(f["ok"] for f in r["probe_findings"] if f["param_name"] is None and f["probe"] != "bucket_offsets")


def test_the_golden_resume_without_restore_adam_step_would_fail() -> None:
    # The detector's other side on the same real documents: undo the workaround's effect on the probe.
    docs = documents("good")
    probes = docs["resume"]["probes"]
    probes["state_after_load"] = probes["state_after_load_raw"]  # as the load left it, before restore-adam-step
    r = evaluate(expected("good")["spec"], docs["train_and_save"], docs["resume"])
    assert r["verdict"] == "fail" and "adam-step-not-restored" in r["signatures"]
    assert r["evidence"]["adam-step-not-restored"]["section"] == "steps"


@pytest.mark.parametrize(("phase", "probe"), [
    ("train_and_save", "state_at_save"), ("train_and_save", "state_final"),
    ("resume", "state_after_load_raw"), ("resume", "state_final_deltas"),
])
def test_the_golden_documents_without_a_state_probe_are_errors(phase: str, probe: str) -> None:
    docs = documents("good")
    assert docs[phase]["schema_version"] == 3
    del docs[phase]["probes"][probe]  # type: ignore[misc]
    r = evaluate(expected("good")["spec"], docs["train_and_save"], docs["resume"])
    assert r["verdict"] == "error" and [e["type"] for e in r["errors"]] == ["MissingProbe"]
    assert f"probes.{probe}" in r["errors"][0]["message"]
