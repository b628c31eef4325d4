"""The state snapshot of a whole DP group, independent of how many ranks hold it (resume_dp).

A resharded resume holds the optimizer state in other shards than the save did, so per-rank
snapshots (`state.snapshot`) of the two phases do not line up. This view gathers every rank's
shards of the main params and moments, puts them back together per parameter, and fingerprints
the full tensors: a load is still a copy, so the saved and the restored views must be identical
bit for bit at any DP size. Sections are those of `state.snapshot`, minus `rng` (per-rank
generators cannot be resharded; configs with dropout are refused by the spec) and minus each
group's rank-local `local_params`. `model`, `groups`, `scheduler` and `iteration` come from every
rank: an item the ranks hold alike is its value, one they hold differently is `ranks-differ(...)`
naming each rank's value, so a rank whose replica drifted shows in the view (and differs from the
other phase's). It is a collective: every rank calls it and gets the same view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from jobs.rank.probes.fingerprints import owned_pairs
from jobs.rank.probes.state import fingerprint, scalar, snapshot

VIEW = "global"  # what a document's one-entry state list is, when the run reshards


def _param_range(opt: Any, model_param: Any) -> tuple[int, int]:
    """The [start, end) of the flattened model param this rank's main shard holds."""
    if hasattr(opt, "_get_model_param_range_map"):
        r = opt._get_model_param_range_map(model_param)["param"]
        return int(r.start), int(r.end)
    return 0, int(model_param.numel())  # not a DistributedOptimizer: every rank holds whole params


def local_shards(tr: Any) -> dict[str, Any]:
    """This rank's pieces of the optimizer state, with where each sits in its parameter."""
    out: dict[str, Any] = {}
    for opt in getattr(tr.optimizer, "chained_optimizers", [tr.optimizer]):
        inner = opt.optimizer
        for model_param, main in owned_pairs(opt):
            start, end = _param_range(opt, model_param)
            state = inner.state.get(main, {})
            out[tr.name_of.get(model_param, "?")] = {
                "range": (start, end),
                "numel": int(model_param.numel()),
                "shape": list(model_param.shape),
                # on the CPU: gathered as objects to every rank (a GPU tensor would unpickle onto its sender's GPU)
                "main": main.detach().reshape(-1).float().cpu().clone(),
                "moments": {
                    k: v.detach().reshape(-1).cpu().clone()
                    for k, v in sorted(state.items())
                    if k != "step" and isinstance(v, torch.Tensor)
                },
                "step": scalar(state["step"]) if "step" in state else None,
            }
    return out


def full_tensor(pieces: list[dict[str, Any]], moment: str | None) -> tuple[torch.Tensor, int]:
    """(one full tensor put together from its shards, how many of its elements some rank held)."""
    first = pieces[0]
    tensors = [(p["range"], p["main"] if moment is None else p["moments"].get(moment)) for p in pieces]
    dtype = next((t.dtype for _, t in tensors if t is not None), torch.float32)
    full = torch.zeros(first["numel"], dtype=dtype)
    covered = torch.zeros(first["numel"], dtype=torch.bool)
    for (start, end), t in tensors:
        if t is not None and t.numel() == end - start:
            full[start:end] = t
            covered[start:end] = True
    return full.reshape(first["shape"]), int(covered.sum())


def _assemble(pieces: list[dict[str, Any]], moment: str | None) -> str:
    """Fingerprint one full tensor from its shards, or say how much of it no rank held."""
    full, held = full_tensor(pieces, moment)
    if held != pieces[0]["numel"]:
        return f"incomplete:{held}/{pieces[0]['numel']}"
    return fingerprint(full)


def by_param(per_rank: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every rank's shards grouped by parameter name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for shards in per_rank:
        for name, piece in shards.items():
            out.setdefault(name, []).append(piece)
    return out


def merge_ranks(per_rank: list[dict[str, str]]) -> dict[str, str]:
    """One value per item when every rank holds the same; `ranks-differ(r0=a, r1=b)` when they do not."""
    out: dict[str, str] = {}
    for key in sorted(set().union(*per_rank)) if per_rank else []:
        values = [section.get(key, "missing") for section in per_rank]
        if len(set(values)) == 1:
            out[key] = values[0]
        else:
            out[key] = "ranks-differ(" + ", ".join(f"r{r}={v}" for r, v in enumerate(values)) + ")"
    return out


def assemble(per_rank: list[dict[str, Any]], snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The DP-size-independent snapshot from every rank's shards and every rank's own snapshot."""
    by_name = by_param(per_rank)
    main: dict[str, str] = {}
    moments: dict[str, str] = {}
    steps: dict[str, str] = {}
    for name in sorted(by_name):
        pieces = by_name[name]
        main[name] = _assemble(pieces, None)
        for moment in sorted({m for p in pieces for m in p["moments"]}):
            moments[f"{name}/{moment}"] = _assemble(pieces, moment)
        values = sorted({p["step"] for p in pieces if p["step"] is not None})
        if values:
            steps[name] = values[0] if len(values) == 1 else "mixed(" + ", ".join(values) + ")"
    groups = [{k: v for k, v in s["groups"].items() if not k.endswith(".local_params")} for s in snapshots]
    return {
        # not a compared section (state_diff.SECTIONS): says what the one entry is, and over how many ranks
        "view": {"kind": VIEW, "ranks": str(len(per_rank))},
        "model": merge_ranks([s["model"] for s in snapshots]),
        "main": main,
        "moments": moments,
        "steps": steps,
        "groups": merge_ranks(groups),
        "scheduler": merge_ranks([s["scheduler"] for s in snapshots]),
        "iteration": merge_ranks([s["iteration"] for s in snapshots]),
    }


def _replicated(snap: dict[str, Any]) -> dict[str, Any]:
    # what every DP rank must hold alike (rng is per rank and not part of the view)
    return {k: snap[k] for k in ("model", "groups", "scheduler", "iteration")}


def global_snapshot(tr: Any, gather: Callable[[Any], list[Any]]) -> dict[str, Any]:
    """Gather every rank's shards and replicated state (a collective) and return the one global snapshot."""
    per_rank = gather(local_shards(tr))
    snapshots = gather(_replicated(snapshot(tr)))
    return assemble(per_rank, snapshots)
