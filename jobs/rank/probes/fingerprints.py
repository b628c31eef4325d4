"""Per-parameter optimizer-state fingerprints (main param, exp_avg, exp_avg_sq, step).

`owned` looks each param's state up by identity (model_*_groups <-> shard_*_groups), so it is
the truth. `slots` reads the state the way checkpoint save/load does, through
`model_param_group_index_map`: it is what the checkpoint records for each param. Comparing
owned-at-save with slots-at-save shows state written under the wrong param even when shard
sizes agree (the silent case); owned-at-save vs owned-after-load shows what the load restored.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from jobs.rank.probes.index_map import distributed_optimizers, own_shards

STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")


def tensor_fingerprint(t: torch.Tensor) -> dict[str, Any]:
    """Summarise a tensor: numel, float64 sum and abs-sum, first values, sha1 of its bytes."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    return {
        "numel": int(flat.numel()),
        "dtype": str(flat.dtype).removeprefix("torch."),
        "sum": float(flat.double().sum()),
        "abs_sum": float(flat.double().abs().sum()),
        "head": [float(v) for v in flat[:3].double()],
        "sha1": hashlib.sha1(flat.view(torch.uint8).numpy().tobytes()).hexdigest(),
    }


def _state_fp(main: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"param": tensor_fingerprint(main)}
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            out[key] = tensor_fingerprint(state[key])
    if "step" in state:
        out["step"] = float(state["step"])
    return out


def owned_pairs(opt: Any) -> list[tuple[Any, Any]]:
    """Return (model param, main param) pairs of one optimizer, found by identity."""
    if hasattr(opt, "model_param_group_index_map"):
        return list(own_shards(opt).items())
    pairs: list[tuple[Any, Any]] = []
    for model_g, main_g in zip(
        getattr(opt, "float16_groups", []), getattr(opt, "fp32_from_float16_groups", []), strict=True
    ):
        pairs.extend(zip(model_g, main_g, strict=True))
    for group in getattr(opt, "fp32_from_fp32_groups", []):
        pairs.extend((p, p) for p in group)
    return pairs


def owned(optimizer: Any, name_of: dict[Any, str]) -> dict[str, Any]:
    """Fingerprint every local param's own state, found by identity."""
    out = {}
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        for model_param, main in owned_pairs(opt):
            out[name_of.get(model_param, "?")] = _state_fp(main, inner.state.get(main, {}))
    return out


def slots(optimizer: Any, name_of: dict[Any, str]) -> dict[str, Any] | None:
    """Fingerprint the state checkpointing reads for each param (through the index map).

    Returns None when there is no DistributedOptimizer (no index map to read through).
    """
    opts = distributed_optimizers(optimizer)
    if not opts:
        return None
    out = {}
    for opt in opts:
        for model_param in opt.model_param_group_index_map:
            tensors = opt._get_main_param_and_optimizer_states(model_param)
            out[name_of.get(model_param, "?")] = _state_fp(tensors["param"], tensors)
    return out
