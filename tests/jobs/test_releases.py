"""The harness on older Megatron-Core releases: a clear 'unsupported' or a meaningful verdict, never our crash.

Two releases are installed once into a cached folder (`pip install --no-deps --target`, ~2 MB
each; PARITY_RELEASE_CACHE, default /var/tmp/parity-releases) and put first on PYTHONPATH.
The whole matrix is `scripts/release-table.sh` (through the service; a command, not a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(1200)]  # past the 300 s ceiling: real builds or many runs
REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PARITY_RELEASE_CACHE", "/var/tmp/parity-releases"))


def _release(version: str) -> Path:
    target = CACHE / version
    if not (target / "megatron" / "core").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        f"megatron-core=={version}"], check=True, timeout=600)
    return target


def _run_local(version: str, tmp_path: Path, *args: str, config: str = "moe-fp32-router") -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_release(version)), str(REPO)]))
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "run-local", "--config", config, "--dp", "2", "--steps", "4",
         "--save-step", "2", "--run-folder", str(tmp_path / "run"), "--json", *args],
        env=env, capture_output=True, text=True, timeout=900,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    assert result["phases"]["train_and_save"]["info"].get("megatron_core", version) == version
    return result


@pytest.mark.nightly
def test_a_sharding_type_the_release_lacks_is_unsupported_by_build(tmp_path: Path) -> None:
    result = _run_local("0.14.0", tmp_path)  # dp_reshardable arrived in 0.15
    assert result["verdict"] == "error"
    assert result["signatures"] == ["unsupported-by-build"]
    message = result["error"]["message"]
    assert "sharding 'dp_reshardable' is not supported by this build (megatron-core 0.14.0)" in message
    assert "fully_sharded_model_space" in message  # what it does offer


@pytest.mark.nightly
def test_an_optimizer_the_release_lacks_is_unsupported_by_build(tmp_path: Path) -> None:
    # the layer-wise optimizer arrived in 0.16: older builds must say so, not crash with ModuleNotFoundError
    result = _run_local("0.14.0", tmp_path, "--sharding", "fully_sharded_model_space", config="layerwise-empty-rank")
    assert (result["verdict"], result["signatures"]) == ("error", ["unsupported-by-build"]), result.get("error")
    message = result["error"]["message"]
    assert "optimizer 'layerwise-adam' is not supported by this build (megatron-core 0.14.0)" in message


@pytest.mark.nightly
def test_a_release_with_another_bucket_layout_still_gets_a_verdict(tmp_path: Path) -> None:
    result = _run_local("0.12.3", tmp_path, "--sharding", "fully_sharded_model_space")
    baseline = result["phases"]["train_and_save"]
    buckets = result["probes"]["train_and_save"]["buckets"]
    assert buckets["applicable"] is False and "not applicable on this build" in buckets["reason"]
    assert "param_to_index" in buckets["reason"]
    assert any("quantize_param_shard" in s for s in baseline["info"]["compat_shims"])
    # Bug A predates 0.13: the index-map probe finds it and the save of the misaligned state fails
    assert result["verdict"] == "fail", (result["signatures"], result.get("error"))
    assert "optimizer-index-misalignment" in result["signatures"]


@pytest.mark.nightly
def test_the_layerwise_optimizer_gets_base_torch_optimizers() -> None:
    """0.18+ refuse the FP32Optimizer get_megatron_optimizer returns ("Do not pre-wrap"); 0.16/0.17 unwrap it
    themselves. The harness unwraps it for every release (jobs/rank/compat.py); the release table's 0.18.2 and
    0.19.2 layerwise-empty-rank rows are that check end to end (docs/releases.md)."""
    import torch
    from megatron.core.optimizer.optimizer import FP32Optimizer

    from jobs.rank.compat import layerwise_inner_optimizers

    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    # its __init__ asks for a CUDA device on this CPU build; the wrapper holds the torch optimizer as
    # `.optimizer`, which is what 0.16/0.17 unwrap
    wrapped = FP32Optimizer.__new__(FP32Optimizer)
    wrapped.optimizer = adam
    inner = layerwise_inner_optimizers([wrapped, adam])
    assert inner[0] is adam and inner[1] is adam
