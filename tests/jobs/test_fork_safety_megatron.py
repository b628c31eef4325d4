"""Fork safety on GPUs: the processes that fork phase children never initialise CUDA (issue 42).

On an H200 every check under isolation "process" failed with "Cannot re-initialize CUDA in forked
subprocess": CUDA was touched before the fork. Here a fresh interpreter replaces every torch.cuda entry
point that initialises CUDA (or, on a GPU build, poisons fork) with a tripwire that raises and records
the call in any process that forks phase children: the warm-pool task (its pre-imports and its order
handling) and the attempt child it forks (which pre-imports again and forks each phase). A phase child
calls through. A full CPU check must still pass with no call tripped (tests/jobs/fork_safety_run.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.run_folder import RunFolder
from jobs.verdict.compare import evaluate
from jobs.verdict_names import PASS

pytestmark = pytest.mark.megatron
SCRIPT = Path(__file__).with_name("fork_safety_run.py")
ROOT = Path(__file__).resolve().parents[2]
SPEC = {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2,
        "workarounds": ["match-groups-by-lr-bounds", "restore-adam-step"]}


def _python_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    return env


def test_a_warm_order_passes_with_cuda_initialisation_forbidden_before_every_fork(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), json.dumps(SPEC)], env=_python_env(),
                         capture_output=True, text=True, timeout=280)
    tripped = tmp_path / "tripped.jsonl"
    assert not tripped.exists(), "CUDA touched before a fork:\n" + tripped.read_text()
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit"] == 0 and summary["preload"]["preload_failed"] == {}
    assert summary["preload"]["cuda_initialized_at_fork"] is False
    # the tripwire was live all along: the phase children went through it (the CPU shims ask is_available)
    calls = [json.loads(line) for line in (tmp_path / "child_calls.jsonl").read_text().splitlines()]
    assert {c["call"] for c in calls} >= {"torch.cuda.is_available"}
    runs = RunFolder(tmp_path / "run")
    docs = [json.loads((runs.attempt(p, 1).folder / "result.rank0.json").read_text())
            for p in ("train_and_save", "resume")]
    assert len({c["pid"] for c in calls}) == 2  # two phase children, each its own process
    result = evaluate(SPEC, docs[0], docs[1])
    assert result["verdict"] == PASS, result.get("error")


def test_the_pre_importing_parent_asks_about_cuda_only_through_nvml() -> None:
    # cudaGetDeviceCount (torch.cuda.is_available()'s default) initialises the driver and poisons fork;
    # with PYTORCH_NVML_BASED_CUDA_CHECK=1 an import that asks answers from NVML instead
    code = ("import os, json; from jobs.rank.attempt import preload; info = preload(); "
            "print(json.dumps([os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'), info['cuda_initialized_at_fork']]))")
    out = subprocess.run([sys.executable, "-c", code], env=_python_env(), capture_output=True, text=True,
                         timeout=200, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["1", False]
