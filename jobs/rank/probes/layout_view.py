"""The state of a whole model in one view that no parallel layout shows through (a resume on another TP / PP / EP).

A resume on another tensor, pipeline or expert parallel size holds every tensor in other pieces than the save
did: a TP shard is half a matrix, a pipeline stage holds other layers, an expert sits on another rank under
another local index. The names of `named_parameters()` say nothing across layouts, but the keys and offsets
Megatron-Core checkpoints by do, so this view is built from the very sharded state dict a save writes
(`checkpoint.sharded_state`, fully_reshardable): each rank hands over the main replica of every sharded tensor
(a factory, SwiGLU's fc1, as the halves it saves), and the full tensors are put back together by key and global
offset, then fingerprinted. A TP shard is placed where its rank holds it, not only where the build says: a build that
numbers its TP shards wrongly but alike at save and load (the reversed rank order of a TP change's bug) resumes
on its own layout as saved and would put the halves in the same wrong places in both views; the param's own
TP attributes (`partition_dim`, and the rank in the TP group) give the engine's offset, which replaces the
build's for that param's model and optimizer pieces (the build's offset is what the checkpoint's reader uses, so
a resume on another TP size then shows the swap as "loaded wrong", naming the tensor). Likewise each decoder
layer is keyed at the global layer its stage (and virtual chunk) holds by Megatron-Core's uniform split, whatever
number the build gave it (`pipeline_layers`): a build that keys one stage's layers under another's numbers,
alike at save and load, otherwise restored "matching" on PP 1 and was named as a divergence. Model weights and
persistent buffers are keyed by their checkpoint key (`model`),
the FP32 main params and Adam moments by their parameter's (`main`, `moments`: `<key>/exp_avg`). A tensor padded
to the vocabulary (the embedding, an untied output layer: Megatron-Core's `allow_shape_mismatch`) and its optimizer
state keep the rows both layouts hold (`vocab_rows`): a TP change may change the padding, as Megatron-LM allows with
distributed checkpoints, and the load then restores those rows, dropping the rest or filling new rows with zeros; the
view's own entry says how many rows each side held. Param groups
are keyed by what identifies a group (its LR and weight-decay multipliers and bounds, expert or not), never by
its index, which a layout changes; scheduler and loop state come from every rank, as in the DP view.

It is a collective: every rank calls it. Only rank 0 assembles; every rank returns the same view.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jobs.rank.probes.global_state import merge_ranks
from jobs.rank.probes.state import fingerprint, iteration_section, scalar, scheduler_section

VIEW = "layout-free"
VOCAB = "vocab"  # global_tensors' entry of the vocabulary's rows (not a tensor section)
# optimizer.state.<what>.<param key>, with or without a chain's prefix
_OPTIMIZER_KEY = re.compile(r"^optimizer\.(?:chained_\d+\.)?state\.([^.]+)\.(.+)$")
MAIN_STATE = "param"  # the fully_reshardable name of a param's FP32 main copy
# what tells param groups apart whatever the layout (their index does not)
GROUP_IDENTITY = ("wd_mult", "lr_mult", "is_expert_parallel", "is_decoupled_lr", "max_lr", "min_lr")


def _sharded_tensors(tree: Any) -> Iterator[tuple[Any, int]]:
    """(each ShardedTensor a save writes, the id of the tensor it comes from: a factory's param for its halves)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    for value in nested_values(tree):
        if isinstance(value, ShardedTensorFactory):  # saved as what it builds (SwiGLU: two halves of one key)
            yield from ((v, id(value.data)) for v in nested_values(value.build()) if isinstance(v, ShardedTensor))
        elif isinstance(value, ShardedTensor):
            yield value, id(value.data)


def _is_main_replica(replica_id: Any) -> bool:
    ids = replica_id if isinstance(replica_id, tuple) else (replica_id,)
    return all(int(r) == 0 for r in ids)


def tp_placement(sh: Any, tp_rank: int, tp_size: int) -> tuple[int, ...] | None:
    """Where this rank holds a TP-sharded param, by its own attributes (the ShardedTensor's offsets with the
    partition axis from `tp_rank`), or None where the piece is not a whole TP param of this TP group."""
    data = sh.data
    if not getattr(data, "tensor_model_parallel", False) or int(getattr(data, "partition_stride", 1)) != 1:
        return None
    dim = int(getattr(data, "partition_dim", -1))
    if dim < 0 or tuple(sh.local_shape) != tuple(data.shape) or sh.flattened_range is not None:
        return None  # a part of the param (a factory's half, a flattened range): placed by the build alone
    axis = int(sh.prepend_axis_num) + dim
    fragments = sh.axis_fragmentations
    if fragments is None or int(fragments[axis]) != tp_size:  # another group's split (expert TP): not ours to say
        return None
    offset = [int(x) for x in sh.global_offset]
    offset[axis] = tp_rank * int(data.shape[dim])
    return tuple(offset)


def _param_key(key: str) -> str:
    match = _OPTIMIZER_KEY.match(key)
    return match.group(2) if match else key


# a decoder layer's param as the trainee names it: `[model<v>.]module[.module].decoder.layers.<local index>.…`
_LAYER_PARAM = re.compile(r"^(?:model(\d+)\.)?(?:module\.)*decoder\.layers\.(\d+)\.")
_LAYER_KEY = re.compile(r"^(decoder\.layers\.)(\d+)(\..*)$")  # a checkpoint key of one layer (singleton shards)


def pipeline_layers(tr: Any, pp_rank: int, pp_size: int) -> dict[int, int]:
    """{id(param): the global layer index this rank's stage (and virtual chunk) holds it at}, for each decoder
    layer's param, by Megatron-Core's uniform split computed here ({} where the split is not uniform)."""
    cfg = tr.config
    chunks = cfg.virtual_pipeline if pp_size > 1 and cfg.virtual_pipeline > 1 else 1
    if pp_size <= 1 or cfg.kind != "gpt" or cfg.num_layers % (pp_size * chunks):
        return {}
    per_chunk = cfg.num_layers // (pp_size * chunks)  # layers of one stage's chunk
    out: dict[int, int] = {}
    for name, param in tr.ddp.named_parameters():
        match = _LAYER_PARAM.match(name)
        if match:
            chunk, local = int(match.group(1) or 0), int(match.group(2))
            out[id(param)] = chunk * (cfg.num_layers // chunks) + pp_rank * per_chunk + local
    return out


def _pp_placement(sh: Any, layer: int | None, offset: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """A decoder layer's piece keyed (a layer's own key) or placed (the stacked layers' axis) at `layer`."""
    if layer is None:
        return sh.key, offset
    own = _LAYER_KEY.match(sh.key)
    if own:
        return f"{own.group(1)}{layer}{own.group(3)}", offset
    if int(sh.prepend_axis_num) >= 1 and sh.key.startswith("decoder.layers."):
        return sh.key, (layer, *offset[1:])
    return sh.key, offset


def _padded_to_vocab(sh: Any) -> bool:
    return bool(getattr(sh, "allow_shape_mismatch", False))


# a routed expert's param as the trainee names it (SequentialMLP: `…mlp.experts.local_experts.<local index>.…`)
_EXPERT_PARAM = re.compile(r"\.experts\.local_experts\.(\d+)\.")
_EXPERT_KEY = re.compile(r"^(.*\.experts\.)(\d+)(\..*)$")  # a checkpoint key of one expert (singleton shards)


def expert_indices(tr: Any, ep_rank: int, ep_size: int) -> dict[int, int]:
    """{id(param): the global expert index this EP rank's local expert is}, for each routed expert's param, by
    Megatron-Core's even split (EP rank r holds experts r x local .. r x local + local - 1) computed here."""
    experts = int(getattr(tr.config, "num_experts", 0) or 0)
    if not experts or experts % ep_size:
        return {}
    local = experts // ep_size
    out: dict[int, int] = {}
    for name, param in tr.ddp.named_parameters():
        match = _EXPERT_PARAM.search(name)
        if match:
            out[id(param)] = ep_rank * local + int(match.group(1))
    return out


def _ep_placement(sh: Any, expert: int | None, key: str, offset: tuple[int, ...],
                  experts: int) -> tuple[str, tuple[int, ...]]:
    """A routed expert's piece keyed (an expert's own key) or placed (the stacked experts' axis, the last one
    prepended) at global expert `expert`."""
    if expert is None:
        return key, offset
    own = _EXPERT_KEY.match(key)
    if own:
        return f"{own.group(1)}{expert}{own.group(3)}", offset
    axis = int(sh.prepend_axis_num) - 1
    if axis >= 0 and int(sh.global_shape[axis]) == experts:
        return key, (*offset[:axis], expert, *offset[axis + 1:])
    return key, offset


def local_pieces(state: dict[str, Any], tr: Any) -> list[dict[str, Any]]:
    """This rank's main-replica pieces of every sharded tensor of a save's model and optimizer state, each TP
    param's pieces placed where this rank holds it (`tp_placement`) and each decoder layer's at the layer its
    stage holds (`pipeline_layers`); a param's optimizer state goes where the param went."""
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    layers = pipeline_layers(tr, parallel_state.get_pipeline_model_parallel_rank(),
                             parallel_state.get_pipeline_model_parallel_world_size())
    experts = expert_indices(tr, parallel_state.get_expert_model_parallel_rank(),
                             parallel_state.get_expert_model_parallel_world_size())
    num_experts = int(getattr(tr.config, "num_experts", 0) or 0)
    # (the build's key, its offset) -> (the engine's key, its offset), for each model piece the engine placed
    moved: dict[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...]]] = {}
    vocab_padded: set[str] = set()  # the build's keys of the model's tensors padded to the vocabulary
    pieces = []
    for part in ("model", "optimizer"):
        for sh, owner in _sharded_tensors(state[part]):
            if sh.data is None or not _is_main_replica(sh.replica_id):
                continue
            flat = sh.flattened_range
            key, offset = sh.key, tuple(int(x) for x in sh.global_offset)
            padded = _padded_to_vocab(sh)
            if part == "model":
                if padded:
                    vocab_padded.add(sh.key)
                placed = tp_placement(sh, tp_rank, tp_size) if tp_size > 1 else None
                key, placed_offset = _pp_placement(sh, layers.get(owner), placed or offset)
                key, placed_offset = _ep_placement(sh, experts.get(owner), key, placed_offset, num_experts)
                if (key, placed_offset) != (sh.key, offset):
                    moved[(sh.key, offset)] = (key, placed_offset)
                    offset = placed_offset
            else:
                param = _param_key(sh.key)
                padded = padded or param in vocab_padded  # a padded param's optimizer state is padded alike
                if param != sh.key and (param, offset) in moved:
                    new_param, offset = moved[(param, offset)]
                    key = sh.key[: len(sh.key) - len(param)] + new_param
            pieces.append({
                "key": key, "shape": tuple(int(x) for x in sh.global_shape),
                "offset": offset, "prepend": int(sh.prepend_axis_num),
                "local_shape": tuple(int(x) for x in sh.local_shape),
                "flat": None if flat is None else (int(flat.start), int(flat.stop)),
                "vocab_padded": padded,
                # on the CPU: gathered as objects to rank 0
                "data": sh.data.detach().cpu().clone(),
            })
    return pieces


def assemble(pieces: list[dict[str, Any]], vocab_rows: int | None = None) -> dict[str, tuple[torch.Tensor, int]]:
    """{key: (the full tensor, how many of its elements some rank held)} from every rank's pieces; a tensor padded
    to the vocabulary keeps its first `vocab_rows` rows (None: all)."""
    full: dict[str, torch.Tensor] = {}
    held: dict[str, torch.Tensor] = {}
    row_axis: dict[str, int] = {}  # key -> the vocabulary's axis, for the tensors padded to it
    for p in pieces:
        if p.get("vocab_padded"):
            row_axis[p["key"]] = p["prepend"]
        tensor = full.setdefault(p["key"], torch.zeros(p["shape"], dtype=p["data"].dtype))
        covered = held.setdefault(p["key"], torch.zeros(p["shape"], dtype=torch.bool))
        sizes = (1,) * p["prepend"] + p["local_shape"]
        index = tuple(slice(o, o + n) for o, n in zip(p["offset"], sizes, strict=True))
        local = torch.zeros(p["local_shape"], dtype=tensor.dtype)
        mask = torch.zeros(p["local_shape"], dtype=torch.bool)
        start, stop = p["flat"] if p["flat"] is not None else (0, local.numel())
        local.view(-1)[start:stop] = p["data"].reshape(-1).to(tensor.dtype)
        mask.view(-1)[start:stop] = True
        region, seen = tensor[index].reshape(p["local_shape"]), covered[index].reshape(p["local_shape"])
        tensor[index] = torch.where(mask, local, region).reshape(tensor[index].shape)
        covered[index] = (seen | mask).reshape(covered[index].shape)
    if vocab_rows is not None:
        for key, axis in row_axis.items():
            rows = min(vocab_rows, full[key].shape[axis])
            full[key], held[key] = full[key].narrow(axis, 0, rows), held[key].narrow(axis, 0, rows)
    return {k: (t, int(held[k].sum())) for k, t in full.items()}


def vocab_rows_held(pieces: list[dict[str, Any]]) -> str:
    """The rows of the vocabulary this layout holds (the padded embedding's global rows), or "" without one."""
    rows = {p["shape"][p["prepend"]] for p in pieces if p.get("vocab_padded")}
    return "|".join(str(r) for r in sorted(rows))


def sections(tensors: dict[str, tuple[torch.Tensor, int]]) -> dict[str, dict[str, torch.Tensor | str]]:
    """The full tensors by section: model (checkpoint key), main and moments (`<param key>/<state>`)."""
    out: dict[str, dict[str, torch.Tensor | str]] = {"model": {}, "main": {}, "moments": {}}
    for key, (tensor, held) in sorted(tensors.items()):
        value: torch.Tensor | str = tensor if held == tensor.numel() else f"incomplete:{held}/{tensor.numel()}"
        match = _OPTIMIZER_KEY.match(key)
        if match is None:
            out["model"][key] = value
        elif match.group(1) == MAIN_STATE:
            out["main"][match.group(2)] = value
        else:
            out["moments"][f"{match.group(2)}/{match.group(1)}"] = value
    return out


def group_values(optimizer: Any) -> dict[str, set[str]]:
    """Every param group's scalars on this rank, keyed `<what identifies the group>.<scalar>`."""
    out: dict[str, set[str]] = {}
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for group in opt.optimizer.param_groups:
            ident = ",".join(f"{k}={scalar(group[k])}" for k in GROUP_IDENTITY if k in group) or "default"
            for key, value in group.items():
                if key != "params" and key not in GROUP_IDENTITY:
                    out.setdefault(f"{ident}.{key}", set()).add(scalar(value))
    return out


def _adam_steps(optimizer: Any) -> set[str]:
    steps = set()
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in opt.optimizer.state.values():
            if "step" in state:
                steps.add(scalar(state["step"]))
    return steps


def _replicated(tr: Any) -> dict[str, Any]:
    # the scheduler and loop sections only: a whole-rank snapshot fingerprints every tensor again (seconds)
    return {"scheduler": scheduler_section(tr), "iteration": iteration_section(tr),
            "groups": group_values(tr.optimizer), "steps": _adam_steps(tr.optimizer)}


def union(per_rank: list[dict[str, set[str]]]) -> dict[str, str]:
    """One value per group scalar over every rank: the distinct values joined by `|`."""
    keys = sorted(set().union(*per_rank)) if per_rank else []
    return {k: "|".join(sorted(set().union(*(r.get(k, set()) for r in per_rank)))) for k in keys}


def global_tensors(tr: Any, state: dict[str, Any], gather: Callable[[Any], list[Any]],
                   vocab_rows: int | None = None) -> dict[str, Any] | None:
    """The full tensors of every section on rank 0 (a collective; None on the other ranks); tensors padded to the
    vocabulary cut to `vocab_rows` (RunSpec.shared_vocab_rows), with the rows this layout holds under `vocab`."""
    per_rank = gather(local_pieces(state, tr))
    if torch.distributed.get_rank() != 0:
        return None
    pieces = [p for rank_pieces in per_rank for p in rank_pieces]
    out: dict[str, Any] = sections(assemble(pieces, vocab_rows))
    out[VOCAB] = {"held": vocab_rows_held(pieces), "compared": "" if vocab_rows is None else str(vocab_rows)}
    return out


def layout_free_snapshot(tr: Any, tensors: dict[str, Any] | None, gather: Callable[[Any], list[Any]]) -> dict[str, Any]:
    """The one view of the whole model's state, the same on every rank (a collective), from `global_tensors`'
    answer (given, so the final state's view and its numeric copy assemble the tensors once)."""
    replicated = gather(_replicated(tr))
    view = None
    if tensors is not None:
        steps = sorted(set().union(*(r["steps"] for r in replicated)))
        view = {
            # not a compared section: what the entry is, and over how many ranks
            "view": {"kind": VIEW, "ranks": str(len(replicated)),
                     **{f"vocab_rows_{k}": v for k, v in tensors.get(VOCAB, {}).items() if v}},
            **{name: {k: v if isinstance(v, str) else fingerprint(v) for k, v in items.items()}
               for name, items in tensors.items() if name != VOCAB},
            "steps": {"adam": steps[0] if len(steps) == 1 else "mixed(" + ", ".join(steps) + ")"} if steps else {},
            "groups": union([r["groups"] for r in replicated]),
            "scheduler": merge_ranks([r["scheduler"] for r in replicated]),
            "iteration": merge_ranks([r["iteration"] for r in replicated]),
        }
    return gather(view)[0]
