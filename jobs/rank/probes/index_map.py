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


def correct_map(opt: Any) -> dict[Any, tuple[int, int]]:
    """The map as it must be: each param at its index in its group's installed order."""
    return {p: (g, k) for g in range(len(opt.model_fp32_groups)) for k, p in enumerate(installed_order(opt, g))}


def bug_a_map(opt: Any) -> dict[Any, tuple[int, int]]:
    """The map Bug A builds, predicted from the build's own groups and grad-buffer walk.

    `_build_optimizer_group_ranges` numbers each param by its place among its group's params in
    grad buffer -> bucket -> param order (`gbuf_ranges`), while the groups are installed FP32 first
    (NVIDIA/Megatron-LM#2777). The group of a param is read from the installed groups, so the
    prediction does not take anything from the map under test.
    """
    group_of = {p: g for g in range(len(opt.model_fp32_groups)) for p in installed_order(opt, g)}
    counts = [0] * len(opt.model_fp32_groups)
    predicted: dict[Any, tuple[int, int]] = {}
    for gbuf_range_map in opt.gbuf_ranges:
        for per_bucket in gbuf_range_map.values():
            for bucket_range in per_bucket:
                for param in bucket_range["param_map"]:
                    g = group_of.get(param)
                    if g is None or param in predicted:
                        continue
                    predicted[param] = (g, counts[g])
                    counts[g] += 1
    return predicted


def explained_by_bug_a(opt: Any) -> dict[Any, bool] | None:
    """For each param, whether its map entry is the correct one or Bug A's prediction (None: cannot predict)."""
    try:
        predicted = bug_a_map(opt)
    except (AttributeError, KeyError, TypeError):
        return None
    correct = correct_map(opt)
    return {p: pos == correct.get(p) or pos == predicted.get(p) for p, pos in opt.model_param_group_index_map.items()}


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
    explained = explained_by_bug_a(opt)
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
                # the slot Bug A puts this param at: an entry elsewhere is a new bug, not the known one
                "bug_a_predicted": None if explained is None else explained.get(param, False),
            }
        )
    unexplained = [m for m in misaligned if m["bug_a_predicted"] is False]
    return {
        "entries": len(opt.model_param_group_index_map),
        "misaligned_count": len(misaligned),
        "unexplained_count": len(unexplained),
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
        "unexplained_total": sum(r.get("unexplained_count", 0) for r in reports),
        "chain": describe_chain(optimizer),
    }
