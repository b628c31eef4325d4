"""Opt-in workarounds, applied by name; each returns a report of what it changed.

- `realign-param-index`: rebuild `model_param_group_index_map` from the installed order
  `[*model_fp32_groups[g], *model_float16_groups[g]]` (the idea of Megatron-LM PR #5835 / #2872),
  and run the optimizer load under `torch.no_grad()` (PR #5835's second fix: FP32 shards are
  views of leaf params that require grad, so the in-place load copy raises otherwise).
- `load-no-grad`: only the `torch.no_grad()` load fix, leaving the index map as built; shows the
  silent case end to end (state restored through the same wrong map, so loss parity can pass).
- `restore-adam-step`: after a load on the torch-Adam path, set every Adam `step` left at the load
  priming's dummy value back to the checkpoint's step (dp_reshardable leaves it there).
- `load-absent-step`: let fully_reshardable / dp_zero_gather_scatter loads skip the per-param Adam
  `step` their checkpoints do not carry (KeyError: 'step' on the torch-Adam path).
- `match-groups-by-lr-bounds`: let the optimizer load tell apart param groups that differ only in
  their LR bounds (`max_lr` / `min_lr`: decoupled_lr, per-group overrides), as Megatron-LM main's
  `param_group_identifier_keys` does; 0.16.x matches them by keys that leave the bounds out.

Every workaround is narrow: it changes only what its known bug predicts, reports anything else it
would have changed as unexplained (a finding, never corrected), and says when it was not needed.
"""

from __future__ import annotations

from typing import Any

import torch

from jobs.contract import LOAD_ABSENT_STEP, MATCH_GROUPS, REALIGN, RESTORE_STEP
from jobs.rank.probes.index_map import bug_a_map, correct_map, distributed_optimizers


def realign_param_index(optimizer: Any) -> dict[str, Any]:
    """Correct only the index-map entries Bug A predicts; report what it corrected and what it would not.

    Each entry is compared with the correct slot (installed order) and with the slot Bug A puts it
    at (`index_map.bug_a_map`, from the build's own grad-buffer walk). An entry at Bug A's slot is
    moved to the correct one; an entry at neither is left as built and reported as unexplained, so
    a new index-map bug still fails the run (the probe of the effective map sees it) instead of
    being rebuilt away with the known one.
    """
    reports: list[dict[str, Any]] = []
    for i, opt in enumerate(distributed_optimizers(optimizer)):
        old = opt.model_param_group_index_map
        correct = correct_map(opt)
        if set(correct) != set(old):
            # Not the shape this fix understands: changing the map could make things worse.
            reports.append({"optimizer": i, "corrected": 0, "entries": len(old), "unexplained": [],
                            "skipped": "parameter sets of the map and the installed groups differ"})
            continue
        predicted = bug_a_map(opt)
        new = dict(old)
        corrected = 0
        unexplained = []
        for param, pos in old.items():
            if pos == correct[param]:
                continue
            if pos == predicted.get(param):
                new[param] = correct[param]
                corrected += 1
            else:
                unexplained.append({"param": param, "slot": list(pos), "correct": list(correct[param]),
                                    "bug_a_slot": list(predicted[param]) if param in predicted else None})
        opt.model_param_group_index_map = new
        reports.append({"optimizer": i, "corrected": corrected, "entries": len(new), "unexplained": unexplained,
                        "skipped": None})
    return {
        "name": REALIGN,
        "optimizers": reports,
        "corrected_total": sum(r["corrected"] for r in reports),
        "unexplained_total": sum(len(r["unexplained"]) for r in reports),
        "needed": any(r["corrected"] for r in reports),
    }


def name_unexplained(report: dict[str, Any], name_of: dict[Any, str]) -> dict[str, Any]:
    """The realign report with parameters named (it holds the tensors until the document is written)."""
    for r in report["optimizers"]:
        r["unexplained"] = [{**u, "param": name_of.get(u["param"], "?")} for u in r["unexplained"]][:12]
    return report


def adam_steps(optimizer: Any) -> list[float]:
    """Return the distinct Adam `step` values held in the optimizer state of this rank."""
    steps = set()
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if "step" in state:
                steps.add(float(state["step"]))
    return sorted(steps)


def shared_step_params(optimizer: Any) -> int:
    """How many params' Adam `step` is one tensor object shared with another param's.

    torch Adam increments `state["step"]` in place once per param, so a shared tensor advances by
    the number of params sharing it each step: bias correction is wrong from the first resumed update.
    """
    seen: dict[int, int] = {}
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                seen[id(state["step"])] = seen.get(id(state["step"]), 0) + 1
    return sum(n for n in seen.values() if n > 1)


def restore_adam_step(optimizer: Any, checkpoint_step: float, primed: list[float]) -> dict[str, Any]:
    """Give every param its own Adam `step` at `checkpoint_step`, only where the known bugs predict otherwise.

    The torch-Adam load path loses the per-param step in two known ways: dp_reshardable leaves
    each `step` at the value the load priming set (`primed`, read right after the priming), and
    fully_reshardable / dp_zero_gather_scatter set the right value but as one tensor shared by every
    param (DistributedOptimizer.load_state_dict's non-Apex/TE branch). A step already at the
    checkpoint's value in a tensor of its own needs nothing; a step at any other value is not what
    those bugs do: it is left as loaded and reported as unexplained, so the restore diff fails the
    run instead of the workaround hiding it.
    """
    before = adam_steps(optimizer)
    expected = set(primed) | {checkpoint_step}
    unexplained = sorted(v for v in before if v not in expected)
    shared = shared_step_params(optimizer)
    changed = 0
    unshared = 0
    seen: set[int] = set()
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if "step" not in state:
                continue
            first_holder = id(state["step"]) not in seen
            seen.add(id(state["step"]))
            if float(state["step"]) == checkpoint_step:
                if shared and not first_holder:
                    unshared += 1
                    state["step"] = torch.tensor(float(checkpoint_step), dtype=torch.float32,
                                                 device=getattr(state["step"], "device", None))
                continue
            if float(state["step"]) in unexplained:
                continue
            changed += 1
            # A fresh tensor per param: torch Adam increments `step` in place.
            where = getattr(state["step"], "device", None)
            state["step"] = torch.tensor(float(checkpoint_step), dtype=torch.float32, device=where)
    return {
        "name": RESTORE_STEP,
        "checkpoint_step": checkpoint_step,
        "primed": primed,
        "before": before,
        "after": adam_steps(optimizer),
        "changed": changed,
        "unshared": unshared,
        "unexplained": unexplained,
        "needed": changed + unshared > 0,
    }


def load_absent_step(optimizer: Any) -> dict[str, Any]:
    """Let the optimizer-state load skip the per-param Adam `step` its checkpoint does not carry.

    fully_reshardable and dp_zero_gather_scatter write every state tensor but `step` ("handled
    separately": load_state_dict sets it from the param groups), yet on the torch-Adam path
    `_set_main_param_and_optimizer_states` copies every tensor of the primed state, `step` included,
    and raises KeyError: 'step' (optimizer-step-key-missing). Only when the source lacks `step` and the
    destination holds it, the wrapper takes `step` out of the destination for that one copy and puts the
    same tensor back (so no build's copy loop sees it: main's would skip a None, 0.16.1's would copy it);
    any other missing key still raises. The returned report counts the params it let through while the
    load runs; none means the workaround was not needed.
    """
    report: dict[str, Any] = {"name": LOAD_ABSENT_STEP, "params": 0, "optimizers": 0}
    for opt in distributed_optimizers(optimizer):
        original = getattr(opt, "_set_main_param_and_optimizer_states", None)
        if original is None:
            continue
        report["optimizers"] += 1

        def without_step(model_param: Any, tensors: dict[str, Any], _opt: Any = opt, _orig: Any = original) -> Any:
            g, k = _opt.model_param_group_index_map[model_param]
            state = _opt.optimizer.state.get(_opt.optimizer.param_groups[g]["params"][k], {})
            if "step" in tensors or not isinstance(state.get("step"), torch.Tensor):
                return _orig(model_param, tensors)
            report["params"] += 1
            step = state.pop("step")
            try:
                return _orig(model_param, tensors)
            finally:
                state["step"] = step

        opt._set_main_param_and_optimizer_states = without_step
    return report


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


# The LR bounds the scheduler reads per group; Megatron-LM main matches saved groups by them too
# (its keys are ParamGroupOverride's fields), 0.16.x does not.
LR_BOUND_KEYS = ("max_lr", "min_lr")
# The releases the bug was measured in. A later build that collides again re-created a bug upstream
# fixed (a pull request on main, say): that is a regression to show, never one to correct.
MATCH_GROUPS_KNOWN_THROUGH = (0, 16)
_IDENTITY_MODULES = ("megatron.core.optimizer.optimizer", "megatron.core.optimizer.distrib_optimizer")


def group_identity_collisions(optimizer: Any) -> dict[str, Any]:
    """Groups this build's load cannot tell apart although their LR bounds differ (0.16.x's key set).

    Read from the live optimizer before a load: for each inner optimizer, the groups whose values of
    the build's `param_group_identifier_keys` are equal while `max_lr` / `min_lr` differ. Such groups
    collide in the load's matching dict, so one group's saved settings are loaded into both.
    """
    import importlib

    keys = tuple(getattr(importlib.import_module(_IDENTITY_MODULES[0]), "param_group_identifier_keys", ()))
    collisions = []
    for o, opt in enumerate(_inner_optimizers(optimizer)):
        seen: dict[tuple[Any, ...], tuple[int, tuple[Any, ...]]] = {}
        for g, group in enumerate(opt.param_groups):
            ident = tuple(group.get(k, group.get(f"pre_{k}")) for k in keys)
            bounds = tuple(group.get(k) for k in LR_BOUND_KEYS)
            if ident in seen and seen[ident][1] != bounds:
                collisions.append({"optimizer": o, "groups": [seen[ident][0], g],
                                   "lr_bounds": [list(seen[ident][1]), list(bounds)]})
            seen.setdefault(ident, (g, bounds))
    return {"identifier_keys": list(keys), "bounds_in_keys": all(k in keys for k in LR_BOUND_KEYS),
            "collisions": collisions}


def match_groups_by_lr_bounds(optimizer: Any) -> dict[str, Any]:
    """Add the LR bounds to the keys the optimizer load matches param groups by, where the build lacks them.

    Megatron-LM main's fix, applied to this process only: the build's own key tuple, extended by the
    bounds every group carries, in the modules that read it at load time. Nothing else changes; a
    build that already matches by the bounds is left alone (not needed), and the report says which
    groups collided, the only ones whose load it changes.
    """
    import importlib

    from jobs.rank.compat import megatron_version

    found = group_identity_collisions(optimizer)
    report: dict[str, Any] = {"name": MATCH_GROUPS, **found, "needed": bool(found["collisions"])}
    if found["bounds_in_keys"]:
        return report
    version = megatron_version()
    if _release(version) > MATCH_GROUPS_KNOWN_THROUGH:
        report.update(skipped=f"megatron-core {version} is past the releases the bug is known in "
                      f"(through {'.'.join(map(str, MATCH_GROUPS_KNOWN_THROUGH))}.x): a collision there is new")
        return report
    every_group = [g for opt in _inner_optimizers(optimizer) for g in opt.param_groups]
    added = tuple(k for k in LR_BOUND_KEYS if all(k in g for g in every_group))
    for name in _IDENTITY_MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "param_group_identifier_keys"):  # each module that imported the tuple by name
            setattr(module, "param_group_identifier_keys", (*module.param_group_identifier_keys, *added))  # noqa: B010
    report["added_keys"] = list(added)
    return report


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; an unreadable one counts as new (the workaround stays off)."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (99, 99)


def _inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers whose param groups a load matches (one per optimizer of the chain)."""
    return [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
