"""The layout-free state view (jobs/rank/probes/layout_view.py) and the spec of a resume on another layout.

The view puts every checkpointed tensor back together by key and global offset, so a tensor held as TP
halves, as one stage's layers or as flattened DP ranges compares with the same tensor held whole. Pure:
synthetic pieces, no Megatron (the end-to-end runs are in test_layouts_megatron.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from jobs.rank.probes.layout_view import assemble, sections
from jobs.spec import RunSpec, SpecError
from service.core.checks import check_key

FULL = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)  # 2 layers of a 4 x 6 weight


def piece(key: str, data: torch.Tensor, offset: tuple[int, ...], prepend: int = 1,
          flat: tuple[int, int] | None = None, local_shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    return {"key": key, "shape": tuple(FULL.shape), "offset": offset, "prepend": prepend,
            "local_shape": local_shape or tuple(data.shape), "flat": flat, "data": data}


def whole() -> list[dict[str, Any]]:  # TP 1, PP 1: each layer's whole weight (a layer axis prepended)
    return [piece("decoder.layers.w", FULL[layer], (layer, 0, 0)) for layer in range(2)]


def tp_halves() -> list[dict[str, Any]]:  # TP 2 on the last axis, each layer on another pipeline stage's rank
    return [piece("decoder.layers.w", FULL[layer, :, half * 3:(half + 1) * 3].clone(), (layer, 0, half * 3))
            for layer in range(2) for half in range(2)]


def dp_ranges() -> list[dict[str, Any]]:  # the optimizer's flattened DP ranges of each whole layer
    out = []
    for layer in range(2):
        flat = FULL[layer].reshape(-1)
        out += [piece("decoder.layers.w", flat[a:b].clone(), (layer, 0, 0), flat=(a, b), local_shape=(4, 6))
                for a, b in ((0, 10), (10, 24))]
    return out


@pytest.mark.parametrize("layout", [whole, tp_halves, dp_ranges])
def test_every_layout_puts_the_same_tensor_back_together(layout: Any) -> None:
    tensor, held = assemble(layout())["decoder.layers.w"]
    assert held == FULL.numel() and torch.equal(tensor, FULL)


def test_a_piece_no_rank_held_is_named_incomplete_not_zero() -> None:
    """A lost shard must not read as a tensor of zeros that happens to match another lost shard."""
    missing = tp_halves()[:-1]
    by_section = sections(assemble(missing))
    assert by_section["model"]["decoder.layers.w"] == f"incomplete:{FULL.numel() - 12}/{FULL.numel()}"


def test_a_wrong_value_in_one_shard_changes_the_view() -> None:
    """The other side of the detector: one TP half loaded wrong is another tensor than the saved whole."""
    broken = tp_halves()
    broken[1]["data"] = broken[1]["data"] + 1
    assert not torch.equal(assemble(broken)["decoder.layers.w"][0], assemble(whole())["decoder.layers.w"][0])


def test_optimizer_keys_go_to_main_and_moments_by_their_parameters_key() -> None:
    tensors = {k: (FULL, FULL.numel()) for k in (
        "decoder.layers.w", "optimizer.state.param.decoder.layers.w", "optimizer.state.exp_avg.decoder.layers.w",
        "optimizer.chained_1.state.exp_avg_sq.decoder.layers.w")}
    by_section = sections(tensors)
    assert set(by_section["model"]) == {"decoder.layers.w"}
    assert set(by_section["main"]) == {"decoder.layers.w"}
    assert set(by_section["moments"]) == {"decoder.layers.w/exp_avg", "decoder.layers.w/exp_avg_sq"}


TP2 = {"config": "dense-bf16", "dp": 1, "tp": 2, "steps": 5, "save_step": 2, "sharding": "fully_reshardable"}


def test_a_resume_on_another_layout_is_its_own_check_with_its_own_ranks() -> None:
    plain = RunSpec.from_dict(TP2)
    moved = RunSpec.from_dict({**TP2, "resume_tp": 1, "resume_dp": 2})
    assert "resume_tp" not in plain.to_dict() and moved.to_dict()["resume_tp"] == 1
    assert check_key(moved.to_dict()) != check_key(plain.to_dict())
    assert (moved.phase_world_size("train_and_save"), moved.phase_world_size("resume")) == (2, 2)
    assert moved.reshards and moved.layout_free_view and moved.layout_change == "dp1tp2->dp2"
    # as many ranks on both sides: the save's job forks the resume on its own layout; another count is a job of its own
    assert moved.effective_isolation == "process" and moved.effective_tolerance == "reshard"
    fewer = RunSpec.from_dict({**TP2, "resume_tp": 1})
    assert fewer.phase_world_size("resume") == 1 and fewer.effective_isolation == "job"
    # a pure DP reshard keeps its name and its view by parameter name
    dp_only = RunSpec.from_dict({"config": "dense-bf16", "dp": 2, "resume_dp": 1, "steps": 5, "save_step": 2})
    assert not dp_only.layout_free_view and dp_only.layout_change == "2->1"


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"resume_tp": 2}, "resume_tp", "equals tp"),
    ({"resume_tp": 3}, "resume_tp", "3 does not divide"),
    ({"resume_tp": 1, "sharding": "dp_reshardable"}, "resume_tp", "fully_reshardable"),
    ({"resume_tp": 1, "config": "dense-bf16-dropout"}, "resume_tp", "dropout"),
    ({"resume_pp": 2, "tp": 1, "config": "gpt-mtp-fp32-proj"}, "resume_pp", "multi-token-prediction"),
    ({"resume_ep": 2, "tp": 1}, "resume_ep", "MoE"),
    # EP 2 kept while the resume drops to one DP rank: the resume's layout cannot hold it
    ({"config": "moe-fp32-router", "dp": 2, "tp": 1, "ep": 2, "resume_tp": 2, "resume_dp": 1}, "resume_tp",
     r"resume's layout \(dp1tp2ep2\)"),
    ({"resume_tp": "1"}, "resume_tp", "integer"),
    ({"resume_tp": 2**70}, "resume_tp", "out of range"),
])
def test_a_resume_layout_that_cannot_run_is_refused_naming_its_field(change: dict[str, Any], field: str,
                                                                     message: str) -> None:
    """Each refusal names its field."""
    with pytest.raises(SpecError, match=message) as info:
        RunSpec.from_dict({**TP2, **change})
    assert info.value.field == field


@pytest.mark.parametrize(("change", "unsupported"), [
    ({"dp": 2, "ep": 2, "resume_ep": 1}, True),  # experts dense at EP 1: a chain of one against a chain of two
    ({"dp": 2, "resume_ep": 2}, True),
    ({"dp": 4, "ep": 2, "resume_ep": 4}, False),  # both chains of two: the run answers
    ({"dp": 1, "tp": 2, "resume_tp": 1}, False),
])
def test_an_expert_parallel_change_across_one_is_named_unsupported_by_the_build(
    change: dict[str, Any], unsupported: bool
) -> None:
    pytest.importorskip("megatron.core")
    from jobs.rank.compat import UnsupportedByBuild, check_reshard

    spec = RunSpec.from_dict({"config": "moe-recipe", "steps": 5, "save_step": 2, "sharding": "fully_reshardable",
                              **change})
    if not unsupported:
        check_reshard(spec)
        return
    with pytest.raises(UnsupportedByBuild, match="ChainedOptimizer.load_state_dict") as raised:
        check_reshard(spec)
    assert "EP 1" in raised.value.missing and spec.layout_change in raised.value.option


def _tp_param(data: torch.Tensor, dim: int) -> torch.nn.Parameter:
    from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

    param = torch.nn.Parameter(data.clone())
    set_tensor_model_parallel_attributes(param, True, dim, 1)
    return param


@pytest.mark.parametrize("dim", [0, 1])
def test_a_tp_shard_is_placed_where_its_rank_holds_it_not_where_the_build_says(dim: int) -> None:
    """The blind spot of a view built from the build's own offsets: a build that numbers TP shards from the last
    rank (save and load alike) resumes on its own layout as saved, and its TP 2 view would hold the halves
    swapped just as a TP 1 resume loads them. The param's TP attributes place each half by its rank."""
    pytest.importorskip("megatron.core")
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from jobs.rank.probes.layout_view import tp_placement

    weight = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)
    halves = weight.chunk(2, dim=dim)
    for rank, half in enumerate(halves):
        param = _tp_param(half, dim)
        right = ShardedTensor.from_rank_offsets("w", param, (dim, rank, 2))
        wrong = ShardedTensor.from_rank_offsets("w", param, (dim, 1 - rank, 2))  # the reversed numbering
        assert tp_placement(right, rank, 2) == tuple(right.global_offset)
        assert tp_placement(wrong, rank, 2) == tuple(right.global_offset) != tuple(wrong.global_offset)
    # not the engine's to say: a piece that is not a TP param, or split by another group than this TP group
    plain = ShardedTensor.from_rank_offsets("b", torch.nn.Parameter(halves[0].clone()), (dim, 0, 2))
    assert tp_placement(plain, 0, 2) is None
    other_group = ShardedTensor.from_rank_offsets("e", _tp_param(halves[0], dim), (dim, 0, 4))
    assert tp_placement(other_group, 0, 2) is None


def _stage(layers: int, chunks: int = 1) -> torch.nn.Module:
    """A stage's params named as the trainee names them: [model<v>.]module.decoder.layers.<local>.weight."""
    def chunk() -> torch.nn.Module:
        block = torch.nn.Module()
        block.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2, bias=False) for _ in range(layers))
        gpt = torch.nn.Module()
        gpt.decoder = block
        wrapped = torch.nn.Module()
        wrapped.module = gpt
        return wrapped

    if chunks == 1:
        return chunk()
    outer = torch.nn.Module()
    for v in range(chunks):
        outer.add_module(f"model{v}", chunk())
    return outer


@pytest.mark.parametrize(("pp_rank", "chunks", "expected"), [
    (0, 1, [0, 1]), (1, 1, [2, 3]),  # 4 layers on 2 stages
    (0, 2, [0, 2]), (1, 2, [1, 3]),  # a virtual pipeline of 2 chunks: chunk v of stage p holds layer 2v + p
])
def test_each_stage_layer_is_placed_at_the_global_layer_its_stage_holds(pp_rank: int, chunks: int,
                                                                        expected: list[int]) -> None:
    """The PP side of the same blind spot: a build that keys its stages' layers wrongly but alike at save and load
    (one stage's layers under the other's numbers) restored "matching" on PP 1 and was named as a divergence;
    the engine keys each layer by Megatron-Core's uniform split, computed from the layout."""
    from types import SimpleNamespace

    from jobs.configs import CONFIGS
    from jobs.rank.probes.layout_view import pipeline_layers

    cfg = CONFIGS["gpt-recipe"]  # 4 layers; its virtual pipeline of 2
    stage = _stage(layers=4 // (2 * chunks), chunks=chunks)
    tr = SimpleNamespace(config=cfg if chunks == 2 else SimpleNamespace(kind="gpt", num_layers=4, virtual_pipeline=1),
                         ddp=stage)
    placed = pipeline_layers(tr, pp_rank, 2)
    assert [placed[id(p)] for _, p in stage.named_parameters()] == expected
    assert pipeline_layers(tr, 0, 1) == {}  # one stage: the build's keys are the layers' own


def test_a_layer_key_or_the_stacked_layer_axis_is_rewritten_to_the_engines_layer() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from jobs.rank.probes.layout_view import _pp_placement

    weight = torch.nn.Parameter(torch.ones(2, 2))
    own = ShardedTensor.from_rank_offsets("decoder.layers.3.mlp.linear_fc1.weight", weight)
    assert _pp_placement(own, 1, (0, 0)) == ("decoder.layers.1.mlp.linear_fc1.weight", (0, 0))
    stacked = ShardedTensor.from_rank_offsets("decoder.layers.mlp.linear_fc1.weight", weight, (0, 3, 4),
                                              prepend_axis_num=1)
    assert _pp_placement(stacked, 1, (3, 0, 0)) == ("decoder.layers.mlp.linear_fc1.weight", (1, 0, 0))
    other = ShardedTensor.from_rank_offsets("embedding.word_embeddings.weight", weight)
    assert _pp_placement(other, None, (0, 0)) == ("embedding.word_embeddings.weight", (0, 0))


def _experts(local: int) -> torch.nn.Module:
    """One MoE layer's routed experts named as the trainee names them: …mlp.experts.local_experts.<i>.linear_fc2."""
    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.experts = torch.nn.Module()
    layer.mlp.experts.local_experts = torch.nn.ModuleList(
        torch.nn.ModuleDict({"linear_fc2": torch.nn.Linear(2, 2, bias=False)}) for _ in range(local))
    block = torch.nn.Module()
    block.layers = torch.nn.ModuleList([layer])
    gpt = torch.nn.Module()
    gpt.decoder = block
    return gpt


@pytest.mark.parametrize(("ep_rank", "ep_size", "expected"), [(0, 2, [0, 1]), (1, 2, [2, 3]), (3, 4, [3])])
def test_each_expert_is_placed_at_the_global_index_its_ep_rank_holds(ep_rank: int, ep_size: int,
                                                                     expected: list[int]) -> None:
    """The EP side of the blind spot: a build that numbers its experts from the last EP rank, alike at save and
    load, restores "matching" on its own layout; the engine places each expert by Megatron-Core's even split."""
    from types import SimpleNamespace

    from jobs.rank.probes.layout_view import expert_indices

    stage = _experts(local=4 // ep_size)
    tr = SimpleNamespace(config=SimpleNamespace(num_experts=4), ddp=stage)
    placed = expert_indices(tr, ep_rank, ep_size)
    assert [placed[id(p)] for _, p in stage.named_parameters()] == expected
    assert expert_indices(SimpleNamespace(config=SimpleNamespace(num_experts=0), ddp=stage), 0, 1) == {}


def test_an_expert_key_or_the_stacked_expert_axis_is_rewritten_to_the_engines_expert() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from jobs.rank.probes.layout_view import _ep_placement

    weight = torch.nn.Parameter(torch.ones(2, 2))
    # layers and experts stacked (the default): the expert axis is the last one prepended
    stacked = ShardedTensor.from_rank_offsets("decoder.layers.mlp.experts.experts.linear_fc2.weight", weight,
                                              (0, 1, 2), (1, 3, 4), prepend_axis_num=2)
    assert _ep_placement(stacked, 0, stacked.key, (1, 3, 0, 0), 4) == (stacked.key, (1, 0, 0, 0))
    own = ShardedTensor.from_rank_offsets("decoder.layers.1.mlp.experts.3.linear_fc2.weight", weight)
    assert _ep_placement(own, 0, own.key, (0, 0), 4) == ("decoder.layers.1.mlp.experts.0.linear_fc2.weight", (0, 0))
    assert _ep_placement(own, None, own.key, (0, 0), 4) == (own.key, (0, 0))  # not a routed expert


@pytest.mark.parametrize(("tp", "resume_tp", "rows"), [(2, 1, 1152), (1, 2, 1152), (2, 4, 1280)])
def test_a_tp_change_across_a_padding_change_is_a_resume_judged_on_the_rows_both_sizes_hold(
    tp: int, resume_tp: int, rows: int
) -> None:
    """The recipe's vocabulary of 1100 pads to 1152 rows at TP 1, 1280 at TP 2, 1536 at TP 4: Megatron-LM resumes
    across the change (dist checkpoints skip padded_vocab_size), so the spec takes it and the view compares the
    rows both sizes hold."""
    spec = RunSpec.from_dict({**TP2, "config": "gpt-recipe", "tp": tp, "resume_tp": resume_tp,
                              "dp": 2 if tp == 1 else 1, "resume_dp": 2 if resume_tp == 1 and tp == 2 else None})
    assert spec.layout("resume").tp == resume_tp
    assert spec.shared_vocab_rows == rows


def vocab_pieces(rows: int, tp: int) -> list[dict[str, Any]]:
    """An embedding padded to `rows` in TP halves (row-split), values by global row; its Adam moment alike."""
    out = []
    part = rows // tp
    for key in ("embedding.word_embeddings.weight",
                "optimizer.state.exp_avg.embedding.word_embeddings.weight"):
        for r in range(tp):
            data = torch.arange(r * part, (r + 1) * part, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
            out.append({"key": key, "shape": (rows, 3), "offset": (r * part, 0), "prepend": 0,
                        "local_shape": (part, 3), "flat": None, "data": data, "vocab_padded": True})
    return out


def test_a_tensor_padded_to_the_vocabulary_compares_on_the_rows_both_layouts_hold() -> None:
    """TP 2's 1280 rows against TP 1's 1152: the same first 1152 rows compare equal, whole; a shifted row does not."""
    def tensor(pieces: list[dict[str, Any]], section: str, key: str, rows: int | None = 1152) -> torch.Tensor:
        value = sections(assemble(pieces, vocab_rows=rows))[section][key]
        assert isinstance(value, torch.Tensor), value
        return value

    weight, moment = "embedding.word_embeddings.weight", "embedding.word_embeddings.weight/exp_avg"
    saved, restored = vocab_pieces(1280, 2), vocab_pieces(1152, 1)
    assert tensor(saved, "model", weight).shape == (1152, 3)
    assert torch.equal(tensor(saved, "model", weight), tensor(restored, "model", weight))
    assert torch.equal(tensor(saved, "moments", moment), tensor(restored, "moments", moment))
    shifted = vocab_pieces(1152, 1)
    shifted[0]["data"] = shifted[0]["data"] + 128  # the checkpoint's last rows read (a load narrowed from the end)
    assert not torch.equal(tensor(shifted, "model", weight), tensor(saved, "model", weight))
    # without a bound every row stays: a same-padding view compares the padded rows too
    assert tensor(saved, "model", weight, rows=None).shape == (1280, 3)
