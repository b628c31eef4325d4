"""`parity shrink`: the candidates are smaller, the search keeps only changes with the same outcome,
and a real failure (the torch-Adam step restore bug on 0.16.1) shrinks to a strictly smaller spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.contract import ParityResult
from jobs.launch.local import run_parity
from jobs.launch.shrink import candidates, outcome, run_local_command, shrink, size
from jobs.spec import RunSpec

pytestmark = pytest.mark.timeout(900)  # past the 300 s ceiling: real builds or many real runs

SPEC = RunSpec.from_dict({"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3,
                          "workarounds": ["realign-param-index"]})


def test_every_candidate_is_a_valid_strictly_smaller_spec_one_change_away() -> None:
    seen = []
    for change, data in candidates(SPEC):
        spec = RunSpec.from_dict(data)
        assert size(spec) < size(SPEC), change
        seen.append(change.split()[0])
    assert seen[:5] == ["dp", "num_layers", "num_experts", "save_step", "steps"] and "hidden_size" in seen


def test_the_search_keeps_only_changes_with_the_same_outcome(tmp_path: Path) -> None:
    # a stand-in runner: the "bug" needs dp 2 and at least 4 steps; everything else may shrink
    def runner(spec: RunSpec, folder: Path) -> Any:
        bad = spec.dp == 2 and spec.steps >= 4
        return {"verdict": "fail" if bad else "pass", "signatures": ["adam-step-not-restored"] if bad else []}

    result = shrink(SPEC, ("fail", ("adam-step-not-restored",)), tmp_path, runner=runner, log=lambda _: None)
    smallest = RunSpec.from_dict(result["smallest"])
    assert result["strictly_smaller"] and smallest.dp == 2 and smallest.steps == 4
    assert smallest.shape["num_layers"] == 1 and smallest.shape["num_experts"] == 2 and smallest.save_step == 1
    assert any(t["change"] == "dp 1" and not t["kept"] for t in result["trail"])
    assert result["command"].startswith("parity run-local --config moe-fp32-router --dp 2 --steps 4 --save-step 1")
    assert "--workaround realign-param-index" in result["command"] and "--shape num_layers=1" in result["command"]


def test_run_local_command_round_trips_through_the_cli_parser() -> None:
    from service.cli.main import build_parser

    spec = RunSpec.from_dict({"config": "dense-bf16", "dp": 2, "resume_dp": 1, "steps": 5, "save_step": 2,
                              "seed": 7, "workarounds": ["restore-adam-step"], "shape": {"num_layers": 1}})
    args = build_parser().parse_args(run_local_command(spec).split()[1:])
    assert (args.config, args.dp, args.resume_dp, args.steps, args.save_step, args.seed) == (
        "dense-bf16", 2, 1, 5, 2, 7)
    assert args.workarounds == ["restore-adam-step"] and args.shape == ["num_layers=1"]


@pytest.mark.nightly
@pytest.mark.megatron
def test_a_real_failure_shrinks_to_a_strictly_smaller_spec_with_the_same_signature(tmp_path: Path) -> None:
    spec = RunSpec.from_dict({"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3})
    original: ParityResult = run_parity(spec, tmp_path / "original")
    target = outcome(original)
    assert target == ("fail", ("adam-step-not-restored",))
    result = shrink(spec, target, tmp_path, max_runs=4, log=lambda _: None)
    smallest = RunSpec.from_dict(result["smallest"])
    assert result["strictly_smaller"] and size(smallest) < size(spec)
    assert smallest.dp == 1  # the step restore bug does not need two ranks
    kept = [t for t in result["trail"] if t.get("kept")]
    assert kept and all(t["verdict"] == "fail" and t["signatures"] == ["adam-step-not-restored"] for t in kept)


def test_the_repro_command_keeps_a_resume_on_another_layout() -> None:
    """A shrunk repro of a TP 2 -> 1 resume must still resume at TP 1 (else it reproduces another check)."""
    from jobs.launch.shrink import run_local_command

    spec = RunSpec.from_dict({"config": "dense-bf16", "dp": 1, "tp": 2, "resume_tp": 1, "steps": 5, "save_step": 2,
                              "sharding": "fully_reshardable"})
    command = run_local_command(spec)
    assert "--tp 2" in command and "--resume-tp 1" in command and "--sharding fully_reshardable" in command
