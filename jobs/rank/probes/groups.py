"""Bug C probe: do param-group metadata (lr, weight decay, Adam step) agree across ranks?

LayerWiseDistributedOptimizer gives whole params to ranks, so a rank can own nothing in a group;
before core_v0.16.0 such an empty rank 0 wrote broken common metadata to torch_dist checkpoints.
`local_groups` runs on every rank; `check_agreement` runs on rank 0 over the gathered lists.
"""

from __future__ import annotations

from typing import Any


def local_groups(optimizer: Any) -> list[dict[str, Any]]:
    """Describe this rank's param groups: local param count, lr, weight decay, Adam steps."""
    out = []
    for i, opt in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        inner = opt.optimizer
        for g, group in enumerate(inner.param_groups):
            steps = sorted({float(inner.state[p]["step"]) for p in group["params"] if "step" in inner.state.get(p, {})})
            out.append(
                {
                    "optimizer": i,
                    "group": g,
                    "local_params": len(group["params"]),
                    "lr": float(group["lr"]),
                    "weight_decay": float(group.get("weight_decay", 0.0)),
                    "steps": steps,
                }
            )
    return out


def check_agreement(per_rank: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Compare gathered group metadata; list empty (rank, group) pairs and any disagreement."""
    empty = [
        {"rank": r, "optimizer": g["optimizer"], "group": g["group"]}
        for r, groups in enumerate(per_rank)
        for g in groups
        if g["local_params"] == 0
    ]
    disagreements = []
    for idx, ref in enumerate(per_rank[0] if per_rank else []):
        rows = [groups[idx] if idx < len(groups) else None for groups in per_rank]
        for key in ("lr", "weight_decay"):
            values = sorted({row[key] for row in rows if row is not None})
            if len(values) > 1:
                disagreements.append(
                    {"optimizer": ref["optimizer"], "group": ref["group"], "key": key, "values": values}
                )
        steps = sorted({s for row in rows if row is not None for s in row["steps"]})
        if len(steps) > 1:
            disagreements.append({"optimizer": ref["optimizer"], "group": ref["group"], "key": "step", "values": steps})
    return {"empty_rank_groups": empty, "disagreements": disagreements, "agree": not disagreements}
