"""Bug A probe: does `model_param_group_index_map` point every param at its own shard?

The optimizer installs each group as `[*fp32 shards, *fp32-main copies of 16-bit shards]`; the
map is built in grad-buffer walk order. For every param with a local shard the invariant is that
`param_groups[g]["params"][k]` is that param's own shard. Ownership is looked up by identity
through `model_*_groups` / `shard_*_groups`, never through the map under test.
"""

from __future__ import annotations

from typing import Any


def distributed_optimizers(optimizer: Any) -> list[Any]:
    """Return every DistributedOptimizer inside `optimizer` (also inside a ChainedOptimizer)."""
    subs = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    return [o for o in subs if hasattr(o, "model_param_group_index_map")]


def optimizer_kind(opt: Any) -> str:
    """Name one optimizer of a chain: "expert" holds expert-parallel params (allreduce False), else "dense"."""
    params = getattr(opt, "model_param_group_index_map", None) or [
        p for g in getattr(opt.optimizer, "param_groups", []) for p in g["params"]
    ]
    return "expert" if any(not getattr(p, "allreduce", True) for p in params) else "dense"


def group_size(opt: Any) -> int | None:
    """The size of the data-parallel group an optimizer shards over (expert-DP for the expert one)."""
    group = getattr(opt, "data_parallel_group", None)
    return None if group is None else int(group.size())


def describe_chain(optimizer: Any) -> list[dict[str, Any]]:
    """One line per optimizer in a ChainedOptimizer: index, class, kind, DP group size."""
    return [
        {"optimizer": i, "class": type(o).__name__, "kind": optimizer_kind(o), "dp_group_size": group_size(o)}
        for i, o in enumerate(getattr(optimizer, "chained_optimizers", [optimizer]))
    ]


def installed_order(opt: Any, group: int) -> list[Any]:
    """Return the model params of one group in the order their shards were installed."""
    return [*opt.model_fp32_groups[group], *opt.model_float16_groups[group]]


def own_shards(opt: Any) -> dict[Any, Any]:
    """Map each model param to its own main shard, by identity."""
    own: dict[Any, Any] = {}
    for g in range(len(opt.model_fp32_groups)):
        own.update(zip(opt.model_fp32_groups[g], opt.shard_fp32_groups[g], strict=True))
        own.update(zip(opt.model_float16_groups[g], opt.shard_fp32_from_float16_groups[g], strict=True))
    return own


def check_optimizer(opt: Any, name_of: dict[Any, str]) -> dict[str, Any]:
    """Compare one DistributedOptimizer's index map with its installed param groups."""
    own = own_shards(opt)
    kind = optimizer_kind(opt)
    misaligned = []
    for param, (g, k) in opt.model_param_group_index_map.items():
        group_params = opt.optimizer.param_groups[g]["params"]
        installed = group_params[k] if k < len(group_params) else None
        expected = own.get(param)
        if installed is expected:
            continue
        order = installed_order(opt, g)
        holder = order[k] if k < len(order) else None
        misaligned.append(
            {
                "param": name_of.get(param, "?"),
                "optimizer_kind": kind,
                "dtype": str(param.dtype).removeprefix("torch."),
                "group": g,
                "index": k,
                "expected_index": next((i for i, q in enumerate(order) if q is param), None),
                "expected_numel": None if expected is None else int(expected.numel()),
                "installed_numel": None if installed is None else int(installed.numel()),
                "installed_param": None if holder is None else name_of.get(holder, "?"),
            }
        )
    return {
        "entries": len(opt.model_param_group_index_map),
        "misaligned_count": len(misaligned),
        "misaligned": misaligned,
        "group_dtype_order": [
            "".join("F" if str(p.dtype) == "torch.float32" else "b" for p in installed_order(opt, g))
            for g in range(len(opt.model_fp32_groups))
        ],
    }


def probe(optimizer: Any, name_of: dict[Any, str]) -> dict[str, Any]:
    """Run the index-map check on every DistributedOptimizer (each named: dense or expert); summarise."""
    opts = distributed_optimizers(optimizer)
    reports = [
        {"optimizer": i, "kind": optimizer_kind(o), "dp_group_size": group_size(o), **check_optimizer(o, name_of)}
        for i, o in enumerate(opts)
    ]
    return {
        "applicable": bool(opts),
        "optimizers": reports,
        "misaligned_total": sum(r["misaligned_count"] for r in reports),
        "chain": describe_chain(optimizer),
    }
