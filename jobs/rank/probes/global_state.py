"""The state snapshot of a whole DP group, independent of how many ranks hold it (resume_dp).

A resharded resume holds the optimizer state in other shards than the save did, so per-rank
snapshots (`state.snapshot`) of the two phases do not line up. This view gathers every rank's
shards of the main params and moments, puts them back together per parameter, and fingerprints
the full tensors: a load is still a copy, so the saved and the restored views must be identical
bit for bit at any DP size. Sections are those of `state.snapshot`, minus `rng` (per-rank
generators cannot be resharded; configs with dropout are refused by the spec) and minus each
group's rank-local `local_params`. It is a collective: every rank calls it and gets the same view.
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
                "main": main.detach().reshape(-1).float().clone(),
                "moments": {
                    k: v.detach().reshape(-1).clone()
                    for k, v in sorted(state.items())
                    if k != "step" and isinstance(v, torch.Tensor)
                },
                "step": scalar(state["step"]) if "step" in state else None,
            }
    return out


def _assemble(pieces: list[dict[str, Any]], key: str, moment: str | None) -> str:
    """Fingerprint one full tensor from its shards, or say how much of it no rank held."""
    first = pieces[0]
    tensors = [(p["range"], p["main"] if moment is None else p["moments"].get(moment)) for p in pieces]
    dtype = next((t.dtype for _, t in tensors if t is not None), torch.float32)
    full = torch.zeros(first["numel"], dtype=dtype)
    covered = torch.zeros(first["numel"], dtype=torch.bool)
    for (start, end), t in tensors:
        if t is not None and t.numel() == end - start:
            full[start:end] = t
            covered[start:end] = True
    held = int(covered.sum())
    if held != first["numel"]:
        return f"incomplete:{held}/{first['numel']}"
    return fingerprint(full.reshape(first["shape"]))


def assemble(per_rank: list[dict[str, Any]], rank0: dict[str, Any]) -> dict[str, Any]:
    """The DP-size-independent snapshot from every rank's shards and rank 0's own snapshot."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for shards in per_rank:
        for name, piece in shards.items():
            by_name.setdefault(name, []).append(piece)
    main: dict[str, str] = {}
    moments: dict[str, str] = {}
    steps: dict[str, str] = {}
    for name in sorted(by_name):
        pieces = by_name[name]
        main[name] = _assemble(pieces, name, None)
        for moment in sorted({m for p in pieces for m in p["moments"]}):
            moments[f"{name}/{moment}"] = _assemble(pieces, name, moment)
        values = sorted({p["step"] for p in pieces if p["step"] is not None})
        if values:
            steps[name] = values[0] if len(values) == 1 else "mixed(" + ", ".join(values) + ")"
    groups = {k: v for k, v in rank0["groups"].items() if not k.endswith(".local_params")}
    return {
        # not a compared section (state_diff.SECTIONS): says what the one entry is, and over how many ranks
        "view": {"kind": VIEW, "ranks": str(len(per_rank))},
        "model": rank0["model"],
        "main": main,
        "moments": moments,
        "steps": steps,
        "groups": groups,
        "scheduler": rank0["scheduler"],
        "iteration": rank0["iteration"],
    }


def global_snapshot(tr: Any, gather: Callable[[Any], list[Any]]) -> dict[str, Any]:
    """Gather every rank's shards (a collective) and return the one global snapshot."""
    per_rank = gather(local_shards(tr))
    rank0 = gather(snapshot(tr) if torch.distributed.get_rank() == 0 else None)[0]
    return assemble(per_rank, rank0)
