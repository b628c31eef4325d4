"""A cause names what the resume lost: section, Megatron state-dict name, and how (absent from the
checkpoint, skipped by the load, loaded wrong), judged on real documents of injected faults
(tests/golden/causes, captured by tests.golden.capture_causes) and on the known-good golden run."""

from __future__ import annotations

import pytest

from jobs.contract import ParityResult
from jobs.launch.local import format_step_table
from jobs.verdict.causes import (
    ABSENT,
    SKIPPED,
    WRONG,
    Checkpoint,
    cause_line,
    how_restored,
    restore_rows,
    state_dict_name,
)
from jobs.verdict.compare import evaluate
from tests.golden import documents, expected


def judged(case: str, drop: tuple[str, ...] = ()) -> ParityResult:
    docs = documents(case)
    for probe in drop:  # as a document from before that probe existed
        docs["resume"]["probes"].pop(probe)  # type: ignore[misc]
    return evaluate(expected(case)["spec"], docs["train_and_save"], docs["resume"])


def test_a_known_good_run_has_no_cause_line() -> None:
    r = judged("good")
    assert r["verdict"] == "pass" and r["cause_lines"] == {}


def test_a_weight_the_load_put_back_is_skipped_by_the_load() -> None:
    r = judged("causes/skipped")  # model-weight-skipped: the fresh build's embedding survives the load
    assert r["signatures"] == ["model-weights-mismatch"]
    line = r["cause_lines"]["model-weights-mismatch"]
    assert line == f"model-weights-mismatch: model embedding.word_embeddings.weight {SKIPPED} (rank 0)"
    (row,) = r["evidence"]["model-weights-mismatch"]["lost"]["items"]
    assert row["item"] == "module.embedding.word_embeddings.weight"  # the snapshot's name, kept beside it


def test_run_local_prints_the_cause_line() -> None:
    r = judged("causes/skipped")
    assert f"cause: {r['cause_lines']['model-weights-mismatch']}" in format_step_table(r).splitlines()


def test_a_lossy_moment_is_loaded_wrong_with_its_state_dict_name() -> None:
    r = judged("causes/wrong")  # exp-avg-sq-lossy-on-load: every exp_avg_sq through bf16 after the load
    assert r["signatures"] == ["optimizer-moments-mismatch"]
    lost = r["evidence"]["optimizer-moments-mismatch"]["lost"]
    assert lost["hows"] == {WRONG: lost["count"]} and lost["count"] > 1
    # the snapshot's optimizer names carry DDP's and Float16Module's prefixes; the cause does not
    assert all(i["name"].endswith("/exp_avg_sq") and not i["name"].startswith("module.") for i in lost["items"])
    line = r["cause_lines"]["optimizer-moments-mismatch"]
    assert line.startswith("optimizer-moments-mismatch: moments decoder.")
    assert line.endswith(f"/exp_avg_sq {WRONG} (rank 0; +{lost['count'] - 1} more)")


def test_a_tensor_the_checkpoint_dropped_is_named_in_the_final_state_cause() -> None:
    r = judged("causes/absent")  # expert-bias-not-checkpointed: restore diff silent, final state apart
    assert r["signatures"] == ["final-state-mismatch"]
    line = r["cause_lines"]["final-state-mismatch"]
    assert line.startswith(f"final-state-mismatch: non-persistent buffers decoder.layers.0.mlp.router.expert_bias "
                           f"{ABSENT} (rank 0; +")
    lost = r["evidence"]["final-state-mismatch"]["lost"]
    first = [i["name"] for i in lost["items"] if i["how"] == ABSENT]
    assert first == ["decoder.layers.0.mlp.router.expert_bias", "decoder.layers.1.mlp.router.expert_bias"]
    # the listing the verdict read: the checkpoint holds the routers' weights, not their expert_bias
    keys = documents("causes/absent")["resume"]["probes"]["checkpoint_contents"]["keys"]
    assert "decoder.layers.mlp.router.weight" in keys and not any("expert_bias" in k for k in keys)


def test_items_equal_to_the_fresh_build_by_chance_do_not_lead_the_line() -> None:
    r = judged("causes/mixed")  # main-params-from-model: re-derived from the loaded bf16 weights
    lost = r["evidence"]["main-params-mismatch"]["lost"]
    # norm weights and biases still at their init (1.0, 0.0) re-derive to the fresh build's value
    docs = documents("causes/mixed")
    skipped = {i["name"] for i in restore_rows(docs["train_and_save"], docs["resume"])["main"] if i["how"] == SKIPPED}
    assert skipped and all("norm" in n for n in skipped) and lost["hows"][WRONG] > lost["hows"][SKIPPED]
    line = r["cause_lines"]["main-params-mismatch"]
    assert line.startswith("main-params-mismatch: main params decoder.") and f"{WRONG} (rank 0; +" in line
    assert line.endswith(f"more: {lost['hows'][WRONG]} {WRONG}, {lost['hows'][SKIPPED]} {SKIPPED})")


def test_the_checkpoint_listing_says_absent_or_not_asked_for() -> None:
    """The skipped case's own listing, edited as a checkpoint without the embedding would read."""
    key, item = "embedding.word_embeddings.weight", "module.embedding.word_embeddings.weight"

    def judged_with(drop_key: bool) -> dict[str, object]:
        docs = documents("causes/skipped")
        contents = docs["resume"]["probes"]["checkpoint_contents"]
        contents["requested"][0].pop(item)  # the load did not ask for it
        if drop_key:
            contents["keys"].remove(key)  # nor does the checkpoint hold it
        r = evaluate(expected("causes/skipped")["spec"], docs["train_and_save"], docs["resume"])
        return dict(r["evidence"]["model-weights-mismatch"]["lost"]["items"][0])

    assert judged_with(drop_key=True) | {"item": item} == {
        "section": "model", "name": key, "how": ABSENT, "item": item, "rank": 0, "basis": "checkpoint listing"}
    assert judged_with(drop_key=False)["how"] == SKIPPED and judged_with(drop_key=False)["basis"] == \
        "checkpoint listing"


def test_without_the_checkpoint_listing_a_lost_item_is_judged_by_its_values() -> None:
    r = judged("causes/skipped", drop=("checkpoint_contents",))
    assert r["cause_lines"]["model-weights-mismatch"].endswith(f"word_embeddings.weight {SKIPPED} (rank 0)")
    # a document from before both probes: the item is still named, how it was lost is not known
    r = judged("causes/skipped", drop=("checkpoint_contents", "state_before_load"))
    assert r["cause_lines"]["model-weights-mismatch"].endswith("word_embeddings.weight not restored (rank 0)")


@pytest.mark.parametrize(("section", "item", "expected"), [
    ("model", "module.decoder.layers.0.mlp.router.weight", ("model", "decoder.layers.0.mlp.router.weight")),
    ("model", "buffer:module.decoder.layers.1.mlp.router.expert_bias",
     ("buffers", "decoder.layers.1.mlp.router.expert_bias")),
    ("main", "module.module.output_layer.weight", ("main params", "output_layer.weight")),
    ("moments", "module.module.decoder.layers.0.mlp.router.weight/exp_avg",
     ("moments", "decoder.layers.0.mlp.router.weight/exp_avg")),
    ("steps", "module.module.embedding.word_embeddings.weight",
     ("optimizer step", "embedding.word_embeddings.weight/step")),
    ("groups", "o0.g1.lr", ("param groups", "optimizer.param_groups.1.lr")),
    ("scaler", "o0.scale", ("scaler", "optimizer.grad_scaler.scale")),
    ("scheduler", "num_steps", ("scheduler", "scheduler.num_steps")),
    ("rng", "tracker/model-parallel-rng", ("RNG", "rng_state/tracker/model-parallel-rng")),
])
def test_state_dict_names(section: str, item: str, expected: tuple[str, str]) -> None:
    assert state_dict_name(section, item) == expected


def test_the_cause_line_is_bounded() -> None:
    row = {"section": "moments", "name": "x." * 400 + "weight/exp_avg", "how": WRONG, "rank": 1}
    other = {**row, "name": "decoder.final_layernorm.bias/exp_avg"}
    line = cause_line("optimizer-moments-mismatch", [row, other])
    assert len(line) <= 320 and line.endswith(f"weight/exp_avg {WRONG} (rank 1; +1 more)")


def test_an_item_lost_alike_on_every_rank_is_one_item_with_its_ranks() -> None:
    row = {"section": "model", "name": "embedding.word_embeddings.weight", "how": SKIPPED}
    rows = [{**row, "rank": r} for r in range(6)] + [{**row, "name": "output_layer.weight", "rank": 0}]
    assert cause_line("model-weights-mismatch", rows) == (
        f"model-weights-mismatch: model embedding.word_embeddings.weight {SKIPPED} (6 ranks; +1 more)")


def test_an_item_the_load_did_not_ask_for_is_looked_up_under_its_stacked_layer_key() -> None:
    ckpt = Checkpoint({"keys": ["decoder.layers.mlp.linear_fc1.weight", "iteration", "rng_state"], "requested": [{}]})
    assert ckpt.holds("model", "module.decoder.layers.1.mlp.linear_fc1.weight", 0) is True
    assert ckpt.holds("model", "module.decoder.layers.1.mlp.linear_fc2.weight", 0) is False
    assert ckpt.holds("moments", "module.module.output_layer.weight/exp_avg", 0) is False  # no optimizer state
    assert Checkpoint({"keys": ["iteration"], "incomplete": "metadata: OSError"}).holds("iteration", "iteration", 0) \
        is None  # an incomplete listing tells nothing


def test_optimizer_state_is_never_called_absent_from_a_listing_of_another_layout() -> None:
    # at EP 2 (and under dp_zero_gather_scatter) the optimizer's keys name buckets or DP groups, not
    # params: a listing that holds optimizer state cannot say one param's main value or moment is absent
    ckpt = Checkpoint({"keys": ["optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, "
                                "torch.bfloat16).bucket_idx_0", "iteration"], "requested": [{}]})
    assert ckpt.holds("main", "module.decoder.final_layernorm.bias", 0) is None
    assert ckpt.holds("moments", "module.decoder.final_layernorm.bias/exp_avg", 0) is None


def test_a_collision_and_a_wrongly_applied_scalar_get_cause_lines_of_their_own() -> None:
    from jobs.verdict.causes import scalar_cause_lines

    evidence = {
        "param-group-identity-collision": {
            "collisions": [{"optimizer": 0, "groups": [0, 1], "lr_bounds": [[1e-3, 1e-4], [2e-3, 2e-4]]}],
            "identifier_keys": ["wd_mult", "lr_mult"],
        },
        "lr-schedule-mismatch": {"steps": [5], "applied_lr": {"count": 2, "first_step": 5, "items": [
            {"step": 5, "group": "o0.g1", "scalar": "lr", "baseline": 0.002, "resumed": None}]}},
        "param-group-scalars-mismatch": {"names": ["x"]},  # a state finding only: the state diff's line
    }
    lines = scalar_cause_lines(evidence)
    assert lines["param-group-identity-collision"] == (
        "param-group-identity-collision: optimizer 0 groups 0 and 1 (max/min lr 0.001/0.0001 vs 0.002/0.0002) "
        "share this build's identity keys (wd_mult, lr_mult): the load gave both one group's settings")
    assert lines["lr-schedule-mismatch"] == ("lr-schedule-mismatch: group o0.g1 applied lr nothing (no such group) "
                                             "at step 5 where the uninterrupted run applied 0.002 (+1 more)")
    assert "param-group-scalars-mismatch" not in lines
    assert scalar_cause_lines({}) == {}


def test_a_layout_free_views_item_is_judged_by_its_checkpoint_key() -> None:
    """On another layout the state is compared in one view named by checkpoint key (a stacked layer's key, no
    rank): an item the load asked for by that key is not "skipped by the load" (a TP reshard's swapped halves
    were named so), and a key no rank asked for still is."""
    key = "decoder.layers.mlp.linear_fc2.weight"
    ckpt = Checkpoint({"keys": [key, "embedding.word_embeddings.weight"],
                       "requested": [{"module.decoder.layers.0.mlp.linear_fc2.weight": key},
                                     {"module.decoder.layers.1.mlp.linear_fc2.weight": key}]})
    before = [{"model": {key: "init"}}]
    assert ckpt.asked("model", key, 0) is True and ckpt.key_of("model", key, 0) == key
    assert how_restored("model", key, 0, "saved", "swapped", before, ckpt) == WRONG
    assert ckpt.asked("model", "embedding.word_embeddings.weight", 0) is False  # held, never asked for
    # a module name keeps its own rank's answer (never the view's fallback)
    assert ckpt.asked("model", "module.decoder.layers.1.mlp.linear_fc2.weight", 0) is False
