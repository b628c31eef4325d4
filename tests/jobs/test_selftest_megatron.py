"""The mutation self-test on real Megatron-Core: injected resume bugs are caught, benign changes pass.

The catalogue one mutant per run at DP 1 on dense-bf16 (each caught alone, with the evidence naming
what it broke) and an MoE slice at DP 2 on moe-fp32-router with its workarounds; the combined
smoke test (control, the combined faults, a benign change) at DP 1 and 2; and the two faults that
cannot share a run, read from their own runs in the catalogue and the slice: a resumed loop that
differs only after the restore (final state) and an option the build lacks (a crash that must not be
blamed on Bug A). The full matrix (every mutant x DP 1, 2
x dense, MoE) is `parity selftest --dp 1 --dp 2` (the nightly detector-health batch runs it at DP 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.launch.selftest import format_matrix, run_selftest
from jobs.selftest.catalogue import MUTANTS, combined_mutant

DENSE = [n for n, m in MUTANTS.items() if "dense-bf16" in m.bases]
# build-lacks-sharding-type last: its DP 2 run on moe-fp32-router is the one the unsupported-option test reads
MOE_SLICE = ["model-weight-skipped", "exp-avg-sq-reset", "moments-lost-on-last-rank", "benign-stale-grads-after-load",
             "build-lacks-sharding-type"]


def _folder_of(report: dict[str, Any], mutant: str) -> Path:
    """The run folder of one mutant's row in a single-DP report (run_selftest numbers them from 00)."""
    (index,) = [i for i, r in enumerate(report["rows"]) if r["mutant"] == mutant]
    return Path(report["folder"]) / f"dp{report['rows'][index]['dp']}" / f"{index:02d}"


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("catalogue")
    return {**run_selftest(folder, dps=(1,), names=DENSE, bases=("dense-bf16",)), "folder": folder}


@pytest.fixture(scope="module")
def moe_slice(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("moe-slice")
    return {**run_selftest(folder, dps=(2,), names=MOE_SLICE, bases=("moe-fp32-router",)), "folder": folder}


@pytest.mark.nightly  # the full catalogue; the PR tier runs the fast self-test below
def test_catalogue_catches_each_mutant_alone_with_its_evidence(catalogue: dict) -> None:
    assert catalogue["ok"], format_matrix(catalogue)
    rows = {r["mutant"]: r for r in catalogue["rows"]}
    assert sorted(rows) == sorted(DENSE + ["control"])  # one run per mutant, never a bundle
    for name in DENSE:
        m, row = MUTANTS[name], rows[name]
        assert row["outcome"] == ("silent" if m.benign else "caught"), row
        if m.evidence:
            assert row["evidence_missing"] == [] and all(row["evidence_names"].values()), row
    assert rows["iteration-one-behind"]["layer"] == "harness"
    assert rows["common-state-iteration-stale"]["layer"] == "megatron-core"
    assert rows["exp-avg-sq-reset"]["evidence_names"]["optimizer-moments-mismatch"][0].endswith("/exp_avg_sq")


@pytest.mark.nightly  # the full catalogue; the PR tier runs the fast self-test below
def test_moe_slice_at_dp2_names_what_broke(moe_slice: dict) -> None:
    report = moe_slice
    assert report["ok"], format_matrix(report)
    rows = {r["mutant"]: r for r in report["rows"]}
    assert all(r["base"] == "moe-fp32-router" and r["dp"] == 2 for r in rows.values())
    names = rows["exp-avg-sq-reset"]["evidence_names"]["optimizer-moments-mismatch"]
    assert names and all(n.endswith("/exp_avg_sq") for n in names)
    r = json.loads((_folder_of(report, "moments-lost-on-last-rank") / "result.json").read_text())
    assert r["evidence"]["optimizer-moments-mismatch"]["ranks"] == [1]

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(1800)]  # past the 300 s ceiling: real builds or many runs


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("selftest")
    report = run_selftest(folder, dps=(1, 2), fast=True)
    report["folder"] = folder
    return report


def _result(folder: Path, dp: int, index: int) -> dict[str, Any]:
    return json.loads((folder / f"dp{dp}" / f"{index:02d}" / "result.json").read_text())


@pytest.mark.nightly  # each detector's PR-tier runs are in the feature, parity and reshard modules
def test_fast_selftest_catches_everything_and_flags_nothing_benign(fast: dict) -> None:
    assert fast["ok"], format_matrix(fast)
    assert fast["missed"] == 0 and fast["false_alarms"] == 0 and fast["caught"] == 2
    outcomes = {(r["mutant"], r["dp"]): r["outcome"] for r in fast["rows"]}
    assert outcomes[("control", 1)] == outcomes[("control", 2)] == "silent"
    assert outcomes[("combined", 1)] == outcomes[("combined", 2)] == "caught"


@pytest.mark.nightly  # each detector's PR-tier runs are in the feature, parity and reshard modules
@pytest.mark.parametrize("dp", [1, 2])
def test_every_state_signature_fires_with_names(fast: dict, dp: int) -> None:
    r = _result(fast["folder"], dp, 1)  # the combined run
    assert set(combined_mutant().expect) <= set(r["signatures"])
    ev = r["evidence"]
    assert ev["model-weights-mismatch"]["names"] == ["module.embedding.word_embeddings.weight"]
    assert ev["iteration-mismatch"]["items"][0] | {"rank": 0} == {
        "rank": 0, "name": "iteration", "before": "2", "after": "1"
    }
    assert all(n.endswith("/exp_avg_sq") for n in ev["optimizer-moments-mismatch"]["names"])
    assert {n.split("/")[0] for n in ev["rng-state-mismatch"]["names"]} == {"tracker"}
    assert ev["scheduler-state-mismatch"]["names"] == ["num_steps"]
    assert ev["save-mutates-live-state"]["sections"] == ["main"]
    # the Bug C probe: only the last rank's groups were skewed, before the scheduler rewrote lr
    after_opt = ev["param-group-scalars-mismatch"]["after_optimizer_load"]
    assert after_opt["ranks"] == [dp - 1]
    assert ("layerwise-metadata-mismatch" in r["signatures"]) == (dp == 2)


@pytest.mark.nightly  # each detector's PR-tier runs are in the feature, parity and reshard modules
@pytest.mark.parametrize("dp", [1, 2])
def test_known_good_with_dropout_is_bit_identical_and_says_what_the_workaround_hid(fast: dict, dp: int) -> None:
    r = _result(fast["folder"], dp, 0)
    assert r["verdict"] == "pass" and r["signatures"] == [] and r["first_divergent_step"] is None
    assert r["verdict_label"].startswith("pass (worked around: ")
    assert r["worked_around_by"] == {"restore-adam-step": ["adam-step-not-restored"]}
    rows = [s for s in r["steps"] if s["resumed_phase"]]
    assert all(s["grad_norm_baseline"] == s["grad_norm_resumed"] for s in rows)
    assert r["phases"]["resume"]["info"]["restored_iteration"] == 2


@pytest.mark.nightly  # the full catalogue; the PR tier runs the fast self-test below
def test_resumed_loop_difference_shows_in_the_final_state(catalogue: dict) -> None:
    # the catalogue's own run of it (DP 1 on dense-bf16, its first base: what run_one(m, 1, …) runs)
    (row,) = [r for r in catalogue["rows"] if r["mutant"] == "clip-grad-changed-on-resume"]
    assert row["outcome"] == "caught" and row["signatures"] == ["final-state-mismatch"]
    r = json.loads((_folder_of(catalogue, "clip-grad-changed-on-resume") / "result.json").read_text())
    assert r["evidence"]["final-state-mismatch"]["sections"][:1] == ["main"]


@pytest.mark.nightly  # the full catalogue; the PR tier runs the fast self-test below
def test_unsupported_option_is_an_error_not_bug_a(moe_slice: dict) -> None:
    # the MoE slice's run of it: DP 2 on moe-fp32-router (its first base, which has Bug A)
    (row,) = [r for r in moe_slice["rows"] if r["mutant"] == "build-lacks-sharding-type"]
    assert row["outcome"] == "caught", row
    assert row["verdict"] == "error" and row["signatures"][0] == "unsupported-by-build"
    r = json.loads((_folder_of(moe_slice, "build-lacks-sharding-type") / "result.json").read_text())
    assert "optimizer-index-misalignment" not in r["signatures"] and "optimizer-index-misalignment" in r["advisories"]
    assert r["error"]["ranks"] == [0, 1] and len(r["error"]["rank_errors"]) == 1  # one record for both ranks
