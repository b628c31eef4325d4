"""Diff two per-rank state snapshots (see jobs/rank/probes/state.py) into named signatures (pure).

A snapshot is {section: {name: exact text}} per rank. Every difference names its rank, section
and item (a parameter name, `param/exp_avg`, `o0.g1.lr`, `tracker/model-parallel-rng`), so the
evidence says what a resume failed to restore, not only that the loss moved.
"""

from __future__ import annotations

from typing import Any

from jobs.signature_names import (
    ADAM_STEP_NOT_RESTORED,
    FINAL_STATE_MISMATCH,
    ITERATION_MISMATCH,
    LAYERWISE_METADATA_MISMATCH,
    LOSS_SCALER_MISMATCH,
    MAIN_PARAMS_MISMATCH,
    MODEL_WEIGHTS_MISMATCH,
    OPTIMIZER_MOMENTS_MISMATCH,
    PARAM_GROUP_SCALARS_MISMATCH,
    RNG_STATE_MISMATCH,
    SAVE_MUTATES_LIVE_STATE,
    SCHEDULER_STATE_MISMATCH,
)

MAX_ITEMS = 12

# Which signature a difference between the saved and the restored state is, by section.
RESTORE_SIGNATURES = {
    "model": MODEL_WEIGHTS_MISMATCH,
    "main": MAIN_PARAMS_MISMATCH,
    "moments": OPTIMIZER_MOMENTS_MISMATCH,
    "steps": ADAM_STEP_NOT_RESTORED,
    "groups": PARAM_GROUP_SCALARS_MISMATCH,
    "scheduler": SCHEDULER_STATE_MISMATCH,
    "iteration": ITERATION_MISMATCH,
    "rng": RNG_STATE_MISMATCH,
    "scaler": LOSS_SCALER_MISMATCH,
}
SECTIONS = tuple(RESTORE_SIGNATURES)
# Recorded but never compared: non-persistent buffers (Megatron does not checkpoint them; a step's
# finalize_model_grads re-derives or zeroes them, e.g. the routers' local_tokens_per_expert).
# Group keys that only describe this rank's share, not metadata ranks must agree on.
RANK_LOCAL_GROUP_KEYS = ("local_params",)


def section_diff(
    before: dict[str, str] | None, after: dict[str, str] | None, only_before_keys: bool = False
) -> list[dict[str, Any]]:
    """List the items of one section whose text differs (a missing item counts as differing).

    `only_before_keys` ignores items that appear only afterwards (a load may add metadata, such as
    Megatron's `step` in torch Adam's param groups, that the live run never held).
    """
    before, after = before or {}, after or {}
    keys = sorted(before) if only_before_keys else sorted(set(before) | set(after))
    return [
        {"name": k, "before": before.get(k), "after": after.get(k)} for k in keys if before.get(k) != after.get(k)
    ]


def snapshot_diffs(
    before: list[dict[str, Any]] | None, after: list[dict[str, Any]] | None, sections: tuple[str, ...] = SECTIONS
) -> dict[str, list[dict[str, Any]]]:
    """Return {section: [differences with their rank]} over every rank both lists cover."""
    out: dict[str, list[dict[str, Any]]] = {}
    for rank, (a, b) in enumerate(zip(before or [], after or [], strict=False)):
        if not a or not b:
            continue
        for section in sections:
            diffs = section_diff(a.get(section), b.get(section), only_before_keys=section == "groups")
            out.setdefault(section, []).extend({"rank": rank, **d} for d in diffs)
    return {s: d for s, d in out.items() if d}


def summarise(diffs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Evidence for one signature: how many items, on which ranks, which names, the first items."""
    names = list(dict.fromkeys(d["name"] for d in diffs))
    return {
        "count": len(diffs),
        "ranks": sorted({d["rank"] for d in diffs}),
        "names": names[:MAX_ITEMS],
        "items": diffs[:MAX_ITEMS],
        **extra,
    }


def restore_findings(at_save: list[dict[str, Any]] | None, restored: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Map saved-vs-restored differences to signatures: {signature: evidence}."""
    return {
        RESTORE_SIGNATURES[section]: summarise(diffs, section=section)
        for section, diffs in snapshot_diffs(at_save, restored).items()
    }


def mutation_findings(before: list[dict[str, Any]] | None, after: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Evidence that saving changed the live state (any section), or {} when it did not."""
    diffs = snapshot_diffs(before, after)
    if not diffs:
        return {}
    flat = [{"section": s, **d} for s, items in diffs.items() for d in items]
    return {SAVE_MUTATES_LIVE_STATE: summarise(flat, sections=sorted(diffs))}


def final_findings(baseline: list[dict[str, Any]] | None, resumed: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Evidence that the state after step M differs between the two runs, or {}."""
    diffs = snapshot_diffs(baseline, resumed)
    if not diffs:
        return {}
    flat = [{"section": s, **d} for s, items in diffs.items() for d in items]
    return {FINAL_STATE_MISMATCH: summarise(flat, sections=sorted(diffs))}


def group_disagreements(per_rank: list[dict[str, str]] | None) -> list[dict[str, Any]]:
    """Param-group metadata that ranks hold differently (Bug C), one row per key."""
    per_rank = [g for g in per_rank or [] if g is not None]
    if len(per_rank) < 2:
        return []
    out = []
    for key in sorted(set().union(*per_rank)):
        if key.rsplit(".", 1)[-1] in RANK_LOCAL_GROUP_KEYS:
            continue
        values = {rank: groups.get(key) for rank, groups in enumerate(per_rank)}
        if len(set(values.values())) > 1:
            out.append({"key": key, "values": {str(r): v for r, v in values.items()}})
    return out


def groups_after_optimizer_load(
    at_save: list[dict[str, Any]] | None, after_optimizer_load: list[dict[str, str]] | None
) -> dict[str, Any]:
    """Bug C probe: groups right after optimizer.load_state_dict vs at save, and across ranks."""
    ev: dict[str, Any] = {}
    saved = [(s or {}).get("groups") for s in at_save or []]
    diffs = [
        {"rank": rank, **d}
        for rank, (a, b) in enumerate(zip(saved, after_optimizer_load or [], strict=False))
        if a and b
        for d in section_diff(a, b, only_before_keys=True)
    ]
    if diffs:
        ev[PARAM_GROUP_SCALARS_MISMATCH] = summarise(diffs, section="groups", when="after optimizer.load_state_dict")
    disagreements = group_disagreements(after_optimizer_load)
    if disagreements:
        ev[LAYERWISE_METADATA_MISMATCH] = {
            "when": "after optimizer.load_state_dict, before the scheduler",
            "disagreements": disagreements[:MAX_ITEMS],
            "count": len(disagreements),
        }
    return ev
