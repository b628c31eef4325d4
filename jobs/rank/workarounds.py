"""Opt-in workarounds, applied by name; each returns a report of what it changed.

- `realign-param-index`: rebuild `model_param_group_index_map` from the installed order
  `[*model_fp32_groups[g], *model_float16_groups[g]]` (the idea of Megatron-LM PR #5835 / #2872),
  and run the optimizer load under `torch.no_grad()` (PR #5835's second fix: FP32 shards are
  views of leaf params that require grad, so the in-place load copy raises otherwise).
- `load-no-grad`: only the `torch.no_grad()` load fix, leaving the index map as built; shows the
  silent case end to end (state restored through the same wrong map, so loss parity can pass).
- `restore-adam-step`: after a load on the torch-Adam path, set every Adam `step` back to the
  checkpoint's step (dp_reshardable leaves the dummy value 1 from the load priming).
"""

from __future__ import annotations

from typing import Any

import torch

from jobs.contract import REALIGN, RESTORE_STEP
from jobs.rank.probes.index_map import distributed_optimizers, installed_order


def realign_param_index(optimizer: Any) -> dict[str, Any]:
    """Rebuild each DistributedOptimizer's index map in installed order; report corrections."""
    reports = []
    for i, opt in enumerate(distributed_optimizers(optimizer)):
        old = opt.model_param_group_index_map
        new = {p: (g, k) for g in range(len(opt.model_fp32_groups)) for k, p in enumerate(installed_order(opt, g))}
        if set(new) != set(old):
            # Not the shape this fix understands: changing the map could make things worse.
            reports.append(
                {
                    "optimizer": i,
                    "corrected": 0,
                    "entries": len(old),
                    "skipped": "parameter sets of the map and the installed groups differ",
                }
            )
            continue
        corrected = sum(1 for p, pos in new.items() if old[p] != pos)
        opt.model_param_group_index_map = new
        reports.append({"optimizer": i, "corrected": corrected, "entries": len(new), "skipped": None})
    return {"name": REALIGN, "optimizers": reports, "corrected_total": sum(r["corrected"] for r in reports)}


def adam_steps(optimizer: Any) -> list[float]:
    """Return the distinct Adam `step` values held in the optimizer state of this rank."""
    steps = set()
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if "step" in state:
                steps.add(float(state["step"]))
    return sorted(steps)


def restore_adam_step(optimizer: Any, checkpoint_step: float) -> dict[str, Any]:
    """Set every Adam `step` to `checkpoint_step`; report the values before and after."""
    before = adam_steps(optimizer)
    changed = 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if "step" in state and float(state["step"]) != checkpoint_step:
                changed += 1
            if "step" in state:
                # A fresh tensor per param: torch Adam increments `step` in place.
                state["step"] = torch.tensor(float(checkpoint_step), dtype=torch.float32)
    return {
        "name": RESTORE_STEP,
        "checkpoint_step": checkpoint_step,
        "before": before,
        "after": adam_steps(optimizer),
        "changed": changed,
    }


def fp32_leaf_views(optimizer: Any, name_of: dict[Any, str]) -> dict[str, Any]:
    """Measure whether a load outside `torch.no_grad()` would raise on FP32 shards (PR #5835).

    FP32 params' main shards are views of leaf params that require grad; an in-place copy into
    one raises. The copy is tried once, with the view's own values, where it must raise: the
    message is the evidence a `no_grad` load hides. Nothing is written (the check runs first).
    """
    views = []
    for opt in distributed_optimizers(optimizer):
        for model_group, shard_group in zip(opt.model_fp32_groups, opt.shard_fp32_groups, strict=True):
            for param, shard in zip(model_group, shard_group, strict=True):
                base = shard._base
                if base is not None and base.is_leaf and base.requires_grad:
                    views.append((name_of.get(param, "?"), shard))
    message = None
    if views:
        try:
            views[0][1].copy_(views[0][1].detach().clone())
        except RuntimeError as exc:
            message = str(exc).splitlines()[0][:300]
    return {"would_raise": message is not None, "params": [n for n, _ in views][:12], "message": message}
