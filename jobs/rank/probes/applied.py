"""The scalars each optimizer applies at a step, read where it applies them (pure reading, no collective).

The step record's `lr` is one group's (the first of the chain's first optimizer). A resume that gets a
group's own bounds, its weight decay or its Adam step wrong can leave that one right, so each step also
records, right before `optimizer.step()`, every inner optimizer's param groups: the lr and weight decay
the update uses and the Adam step its params are at. A wrong applied LR is then named as an LR cause at
the step and group it was applied, not found later as weights that drifted.
"""

from __future__ import annotations

from typing import Any


def _step_of(inner: Any, group: dict[str, Any]) -> float | None:
    """The Adam step the group's first param with state is at (torch Adam keeps it per param)."""
    for p in group["params"]:
        state = inner.state.get(p) or {}
        if "step" in state:
            return float(state["step"])
    return None


def applied_scalars(optimizer: Any) -> dict[str, list[float | None]]:
    """{"o<i>.g<j>": [lr, weight_decay, adam step]} for every param group this rank's optimizers hold."""
    out: dict[str, list[float | None]] = {}
    for i, opt in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        inner = getattr(opt, "optimizer", opt)
        for j, group in enumerate(inner.param_groups):
            out[f"o{i}.g{j}"] = [float(group["lr"]), float(group.get("weight_decay", 0.0)), _step_of(inner, group)]
    return out
