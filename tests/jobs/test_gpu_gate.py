"""benchmarks/gpu_gate.py, the prepared GPU run: refuses clearly without a GPU, and plans what fits the GPUs there."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_gate.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_gate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None and torch.cuda.device_count():
        pytest.skip("a GPU host")
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 3 and "no GPU is present" in out.stderr and not out.stdout


def test_on_one_gpu_it_plans_the_gate_checks_that_fit_the_mutant_slice_and_the_noise() -> None:
    pytest.importorskip("yaml")
    from jobs.spec import RunSpec

    runs = _module().plan(1, "cuda", quick=False)
    gate = [r for r in runs if r["kind"] == "gate"]
    assert gate and all(r["spec"]["device"] == "cuda" for r in runs)
    for r in gate:  # a check needing more ranks than GPUs is listed as skipped, never run on fewer
        assert ("skip" in r) == (RunSpec.from_dict(r["spec"]).world_size > 1)
    mutants = {r["name"] for r in runs if r["kind"] == "mutant"}
    assert {"exp-avg-sq-lossy-on-load@default", "main-params-from-model@default"} <= mutants
    assert sum(r["kind"] == "noise" for r in runs) == 3
    assert {r["spec"]["config"] for r in runs if r["kind"] == "te"} == {"dense-fp8-te", "moe-grouped-gemm-te"}
    for r in runs:
        RunSpec.from_dict(r["spec"])  # every planned spec is valid
