"""What the step-N checkpoint holds and what the resume's load asked it for (bounded JSON, no tensors).

The verdict names how a resume lost a tensor: absent from the checkpoint, skipped by the load, or
loaded wrong. Values alone cannot tell the first two apart (both leave the fresh build's value), so
the resume records, before it reads the checkpoint:

- `keys`: every key the checkpoint holds: the sharded tensors and objects in torch_dist's metadata
  (a ShardedObject's `/shard_…` suffix dropped) and every leaf path of the common state (`common.pt`:
  `scheduler.num_steps`, `iteration`, …), sorted, at most MAX_KEYS;
- `requested`: per rank, {snapshot item: the checkpoint key the load's sharded state dict asks for it},
  for the model's parameters and buffers (found by tensor identity: torch_dist loads model tensors in
  place, so the sharded tensor's data is the live tensor); an item missing there was not asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

MAX_KEYS = 4000
MAX_DEPTH = 6  # common-state paths deeper than this are cut (the optimizer's param groups stay readable)


def _leaf_paths(node: Any, prefix: str, depth: int, out: list[str]) -> None:
    if isinstance(node, dict) and depth < MAX_DEPTH:
        for k, v in node.items():
            _leaf_paths(v, f"{prefix}.{k}" if prefix else str(k), depth + 1, out)
    elif isinstance(node, (list, tuple)) and depth < MAX_DEPTH and not isinstance(node, torch.Size):
        for i, v in enumerate(node):
            _leaf_paths(v, f"{prefix}.{i}", depth + 1, out)
    elif prefix:
        out.append(prefix)


def checkpoint_keys(folder: Path) -> tuple[list[str], str | None]:
    """(every key the checkpoint holds, why the listing is incomplete or None)."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint import FileSystemReader

    keys: set[str] = set()
    problems = []
    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
        keys.update(k.split("/shard_", 1)[0] for k in metadata.state_dict_metadata)
    except Exception as exc:  # a probe never fails the phase: the verdict falls back to the values
        problems.append(f"metadata: {type(exc).__name__}: {exc}"[:500])
    try:
        common: list[str] = []
        _leaf_paths(dist_checkpointing.load_common_state_dict(str(folder)), "", 0, common)
        keys.update(common)
    except Exception as exc:  # as above (CheckpointingException, an unpicklable entry, …)
        problems.append(f"common state: {type(exc).__name__}: {exc}"[:500])
    ordered = sorted(keys)
    if len(ordered) > MAX_KEYS:
        problems.append(f"{len(ordered)} keys, the first {MAX_KEYS} listed")
    return ordered[:MAX_KEYS], "; ".join(problems) or None


def _identity(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return t.data_ptr(), t.numel(), tuple(t.shape)


def requested_model_keys(module: torch.nn.Module, model_state: dict[str, Any]) -> dict[str, str]:
    """{snapshot item name: the checkpoint key the load asks for it} for the model's params and buffers.

    Names are the snapshot's (`state.snapshot`: parameter names, `buffer:` + buffer names). {} when this
    build lays its sharded state out otherwise: the verdict then judges by the values alone.
    """
    try:
        from megatron.core.dist_checkpointing.dict_utils import nested_values
        from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    except ImportError:
        return {}

    by_tensor: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for value in nested_values(model_state):
        # a factory (SwiGLU's fc1: two matrices saved as halves of one key) asks for its key with the whole tensor
        sharded = isinstance(value, (ShardedTensor, ShardedTensorFactory))
        data = getattr(value, "data", None) if sharded else None
        if isinstance(data, torch.Tensor) and data.numel():
            by_tensor.setdefault(_identity(data), value.key)
    out: dict[str, str] = {}
    for name, p in module.named_parameters():
        if (key := by_tensor.get(_identity(p))) is not None:
            out[name] = key
    for mod_name, mod in module.named_modules():
        for name, buf in mod._buffers.items():
            if buf is not None and (key := by_tensor.get(_identity(buf))) is not None:
                out[f"buffer:{mod_name}.{name}" if mod_name else f"buffer:{name}"] = key
    return out


def report(keys: list[str], incomplete: str | None, requested: list[dict[str, str]]) -> dict[str, Any]:
    """The probe as the resume's document carries it."""
    out: dict[str, Any] = {"keys": keys, "requested": requested}
    if incomplete:
        out["incomplete"] = incomplete
    return out
