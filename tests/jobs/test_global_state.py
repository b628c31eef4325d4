"""The DP-independent state view (resume_dp): shards held by any number of ranks assemble to one fingerprint."""

from __future__ import annotations

from typing import Any

import torch

from jobs.rank.probes.global_state import assemble
from jobs.rank.probes.state import fingerprint

RANK0: dict[str, Any] = {
    "model": {"w": "bf16[2, 3]:x"},
    "groups": {"o0.g0.lr": "0.001", "o0.g0.local_params": "1"},
    "scheduler": {"num_steps": "3"},
    "iteration": {"iteration": "3"},
}


def _piece(full: torch.Tensor, start: int, end: int, step: str = "3.0") -> dict[str, Any]:
    return {"range": (start, end), "numel": 6, "shape": [2, 3], "main": full[start:end].clone(),
            "moments": {"exp_avg": 2 * full[start:end]}, "step": step}


def test_shards_at_two_ranks_and_one_rank_give_the_same_view() -> None:
    full = torch.arange(6, dtype=torch.float32) / 7
    one = assemble([{"w": _piece(full, 0, 6)}], [RANK0])
    two = assemble([{"w": _piece(full, 0, 4)}, {"w": _piece(full, 4, 6)}], [RANK0, RANK0])
    assert {k: v for k, v in one.items() if k != "view"} == {k: v for k, v in two.items() if k != "view"}
    assert (one["view"], two["view"]) == ({"kind": "global", "ranks": "1"}, {"kind": "global", "ranks": "2"})
    assert one["main"]["w"] == fingerprint(full.reshape(2, 3))
    assert one["moments"]["w/exp_avg"] == fingerprint(2 * full.reshape(2, 3))
    assert one["steps"] == {"w": "3.0"} and "o0.g0.local_params" not in one["groups"] and "rng" not in one


def test_a_missing_or_different_shard_shows() -> None:
    full = torch.arange(6, dtype=torch.float32)
    gap = assemble([{"w": _piece(full, 0, 4)}], [RANK0])
    assert gap["main"]["w"] == "incomplete:4/6"
    other = full.clone()
    other[5] += 1
    moved = assemble([{"w": _piece(full, 0, 4)}, {"w": _piece(other, 4, 6, step="1.0")}], [RANK0, RANK0])
    assert moved["main"]["w"] != fingerprint(full.reshape(2, 3))
    assert moved["steps"]["w"] == "mixed(1.0, 3.0)"


def test_every_rank_s_model_and_groups_are_in_the_view_not_rank_0_s_only() -> None:
    full = torch.arange(6, dtype=torch.float32)
    shards = [{"w": _piece(full, 0, 4)}, {"w": _piece(full, 4, 6)}]
    drifted = {**RANK0, "model": {"w": "bf16[2, 3]:y"}, "groups": {**RANK0["groups"], "o0.g0.local_params": "2"}}
    view = assemble(shards, [RANK0, drifted])
    # the last rank's replica differs: the item names both values, so it differs from any agreeing view
    assert view["model"]["w"] == "ranks-differ(r0=bf16[2, 3]:x, r1=bf16[2, 3]:y)"
    assert view["model"] != assemble(shards, [RANK0, RANK0])["model"]
    assert view["groups"] == {"o0.g0.lr": "0.001"}  # rank-local local_params left out; the rest agrees
    skewed = {**RANK0, "groups": {"o0.g0.lr": "0.002"}}
    assert assemble(shards, [RANK0, skewed])["groups"]["o0.g0.lr"].startswith("ranks-differ(")
