"""Tolerance profiles on real Megatron-Core runs: GPU-like noise passes `default` and fails `exact`;
the clean run stays bit-exact; `calibrate` measures run-to-run noise and proposes the profile that covers it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.contract import ParityResult
from jobs.launch.calibrate import calibrate_noise
from jobs.launch.local import run_parity
from jobs.selftest.catalogue import MUTANTS
from jobs.spec import RunSpec
from tests.plugins.tiers import LazyRuns, tiered

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(900)]  # past the 300 s ceiling: real builds or many runs

NOISE = MUTANTS["benign-gradient-noise"]


def _run(tmp: Path, **overrides: object) -> ParityResult:
    return run_parity(RunSpec.from_dict({**NOISE.run_spec(1), **overrides}), tmp)


RUNS: dict[str, dict[str, Any]] = {
    "noise_default_dp1": {},
    "noise_default_dp2": {"dp": 2},
    "noise_exact_dp1": {"tolerance": "exact"},
    "clean_default_dp1": {"mutants": []},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> LazyRuns[ParityResult]:
    return LazyRuns(lambda name: _run(tmp_path_factory.mktemp(name), **RUNS[name]))


@pytest.mark.parametrize("name", tiered(["noise_default_dp1", "noise_default_dp2"], ["noise_default_dp1"]))
def test_gradient_noise_passes_under_default(runs: LazyRuns[ParityResult], name: str) -> None:
    r = runs[name]
    assert r["verdict"] == "pass" and r["signatures"] == [], (r["signatures"], r["errors"], r["evidence"])
    assert r["verdict_label"].startswith("pass (worked around: ") and "[default: loss 0.0001" in r["verdict_label"]
    assert r["lanes"]["tolerance"]["pass"]
    # the noise is real: the final states differ in every numeric section (the per-step values may
    # not show it yet after two resumed steps: a 1e-7 change rarely moves a bf16 weight)
    final = r["lanes"]["final_state"]
    assert final["measured"] and final["pass"]
    assert all(0 < s["max_rel"] <= s["bound"] for s in final["sections"].values())


def test_gradient_noise_fails_under_exact(runs: LazyRuns[ParityResult]) -> None:
    r = runs["noise_exact_dp1"]
    assert r["verdict"] == "fail"
    assert set(r["signatures"]) <= {"final-state-mismatch", "loss-divergence-unexplained"} and r["signatures"]
    # restored state was still exact: the difference is in the loop, where the noise is
    assert not any(s.endswith("-mismatch") and s != "final-state-mismatch" for s in r["signatures"])
    # a lane shows the noise from the first resumed step on, or (a 1e-7 change rarely moves a bf16 weight, and the
    # noise is drawn anew in each run) none does and the final state alone says it: CI saw both
    assert r["first_divergent_step"] in (3, None)
    assert "final-state-mismatch" in r["signatures"] or r["first_divergent_step"] == 3


def test_the_clean_run_stays_bit_exact_under_default(runs: LazyRuns[ParityResult]) -> None:
    r = runs["clean_default_dp1"]
    assert r["verdict"] == "pass" and r["lanes"]["exact"]["pass"]
    sections = r["lanes"]["final_state"]["sections"]
    assert all(s["differing"] == 0 and s["max_rel"] == 0.0 for s in sections.values())


@pytest.mark.nightly  # several runs per proposal; the bounds it proposes are judged in the PR tier above
def test_calibrate_proposes_exact_for_a_deterministic_check_and_default_for_gpu_noise(tmp_path: Path) -> None:
    base = {k: v for k, v in NOISE.run_spec(1).items() if k not in ("mutants", "tolerance")}
    clean = calibrate_noise(base, seeds=(7,), folder=tmp_path / "clean", log=lambda _: None)
    assert clean["proposed_profile"] == "exact" and clean["observed"]["loss_rel"] == 0.0
    noisy = calibrate_noise({**base, "mutants": [NOISE.name]}, seeds=(7,), folder=tmp_path / "noisy",
                            log=lambda _: None)
    assert noisy["proposed_profile"] == "default" and noisy["observed"]["state"]["main"] > 0
