"""A model trained the way production recipes train (`gpt-recipe`) on real Megatron-Core 0.16.1, both sides.

The config turns on what Megatron-LM's and Megatron-Bridge's recipes turn on (SwiGLU, tied embeddings,
2 microbatches through Megatron's schedule, overlapped grad reduce and deferred param gather over several
buckets, bf16 grad reduce, a decoupled LR for the embedding, warmup from a non-zero LR into WSD decay, the
scheduler counted in samples with override_opt_param_scheduler). On 0.16.1 it meets a real upstream bug:
the optimizer load matches param groups by keys without their LR bounds, so the embedding's group
(decoupled_lr) and the default group collide and the default group resumes at the embedding's LR.

- known-bad: without `match-groups-by-lr-bounds` the check fails naming the collision, with the LR each
  group applied at each resumed step (read where the optimizer applies it, not from the scheduler);
- known-good: with it, the resume is bit-exact (loss, grad norm, every group's applied lr / wd / step);
- the recipe really trains as configured: several buckets, 2 microbatches per rank, LR from warmup init.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.launch.local import run_parity
from jobs.spec import RunSpec

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(600)]

RECIPE = {"config": "gpt-recipe", "dp": 2, "steps": 6, "save_step": 2}  # as the gate: inside the warmup
SAMPLES_PER_STEP = 2 * 2 * 2  # DP 2 x 2 microbatches x micro-batch size 2


def _warmup_lr(max_lr: float, step: int) -> float:
    """The LR step `step` applies in gpt-recipe's warmup (from 1e-4 over 3 steps, counted in samples)."""
    return 1e-4 + (max_lr - 1e-4) * float((step - 1) * SAMPLES_PER_STEP) / float(3 * SAMPLES_PER_STEP)


def _run(folder: Path, *workarounds: str) -> dict[str, Any]:
    spec = RunSpec.from_dict({**RECIPE, "workarounds": ["restore-adam-step", *workarounds]})
    return dict(run_parity(spec, folder))


def _doc(folder: Path, phase: str) -> dict[str, Any]:
    return json.loads((folder / phase / "attempt-1" / "result.rank0.json").read_text())  # type: ignore[no-any-return]


def test_the_collision_fails_naming_the_groups_and_the_applied_lr(tmp_path: Path) -> None:
    r = _run(tmp_path)
    assert r["verdict"] == "fail"
    assert {"param-group-identity-collision", "lr-schedule-mismatch"} <= set(r["signatures"])
    collision = r["evidence"]["param-group-identity-collision"]
    # the default group (0) and the embedding's decoupled group (1) share 0.16.1's identity keys
    assert collision["collisions"][0]["groups"] == [0, 1]
    assert collision["collisions"][0]["lr_bounds"] == [[1e-3, 1e-4], [2e-3, 2e-4]]
    applied = r["evidence"]["lr-schedule-mismatch"]["applied_lr"]
    first = applied["items"][0]
    # step 3 is the warmup's last: the default group resumes on the embedding's warmup line
    assert (first["step"], first["group"]) == (3, "o0.g0")
    assert (first["baseline"], first["resumed"]) == (_warmup_lr(1e-3, 3), _warmup_lr(2e-3, 3))
    # on-call reads the known bug first, then the LR it made a group apply
    lines = list(r["cause_lines"].values())
    assert lines[0].startswith("param-group-identity-collision: optimizer 0 groups 0 and 1 (max/min lr")
    assert lines[1].startswith("lr-schedule-mismatch: group o0.g0 applied lr 0.00136667 at step 3")


def test_known_good_recipe_is_bit_exact_and_trains_as_configured(tmp_path: Path) -> None:
    r = _run(tmp_path, "match-groups-by-lr-bounds")
    assert r["verdict"] == "pass" and r["signatures"] == [], r["signatures"]
    assert r["worked_around_by"] == {"restore-adam-step": ["adam-step-not-restored"],
                                     "match-groups-by-lr-bounds": ["param-group-identity-collision"]}
    resumed = [s for s in r["steps"] if s["resumed_phase"]]
    assert len(resumed) == 4
    assert all(s["loss_baseline"] == s["loss_resumed"] and s["grad_norm_baseline"] == s["grad_norm_resumed"]
               for s in resumed)
    base, again = _doc(tmp_path, "train_and_save"), _doc(tmp_path, "resume")
    # every group's applied lr / weight decay / Adam step is the same at every resumed step
    applied = {s["step"]: s["applied"] for s in base["steps"]}
    assert all(s["applied"] == applied[s["step"]] for s in again["steps"])
    # groups with their own LR bounds: the embedding's decoupled group warms up to twice the default's max
    step3 = applied[3]
    assert step3["o0.g0"][0] == _warmup_lr(1e-3, 3) and step3["o0.g1"][0] == _warmup_lr(2e-3, 3)
    assert step3["o0.g2"][1] == 0.0  # no weight decay on norms
    # warmup starts at lr_warmup_init (1e-4), not 0, and the scheduler counts samples (2 ranks x 2 x 2)
    assert applied[1]["o0.g0"][0] == 1e-4
    # the stable phase, then WSD's annealing over the last 2 steps
    assert applied[4]["o0.g0"][0] == applied[5]["o0.g0"][0] == 1e-3 > applied[6]["o0.g0"][0]
    info = base["info"]
    assert info["microbatches_per_rank"] == 2
    assert base["probes"]["buckets"]["per_rank"][0]["buffers"][0]["buckets"] > 1  # several buckets, overlapped
    assert again["info"]["scheduler_num_steps_after_load"] == 2 * SAMPLES_PER_STEP


@pytest.mark.nightly  # the PR tier's recipe runs are gpt-recipe's two sides above (the same recipe path)
def test_moe_recipe_with_production_metadata_is_bit_exact_in_one_key_space(tmp_path: Path) -> None:
    spec = RunSpec.from_dict({"config": "moe-recipe", "dp": 2, "ep": 2, "steps": 8, "save_step": 4,
                              "sharding": "fully_reshardable",
                              "workarounds": ["match-groups-by-lr-bounds", "realign-param-index", "restore-adam-step",
                                              "load-absent-step"]})
    r: dict[str, Any] = dict(run_parity(spec, tmp_path))
    assert r["verdict"] == "pass" and r["signatures"] == [], r["signatures"]
    assert all(s["loss_baseline"] == s["loss_resumed"] for s in r["steps"] if s["resumed_phase"])
    keys = _doc(tmp_path, "resume")["probes"]["checkpoint_contents"]["keys"]
    # chained_optim_avoid_prefix: the dense and the expert optimizer write one key space, as production's do
    assert not [k for k in keys if k.startswith("chained_")]
    assert "optimizer.state.exp_avg.decoder.layers.mlp.experts.experts.linear_fc1.weight" in keys
    # the vocabulary of 1100 is held padded to 1152 (make_vocab_size_divisible_by 128 x TP 1)
    model = _doc(tmp_path, "train_and_save")["probes"]["state_at_save"][0]["model"]
    assert model["module.embedding.word_embeddings.weight"].startswith("bfloat16[1152, 128]")


def test_a_recipe_setting_the_build_lacks_is_unsupported_by_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.configs import CONFIGS
    from jobs.rank import compat

    for name in ("gpt-recipe", "moe-recipe"):
        compat.check_recipe_settings(CONFIGS[name])  # 0.16.1 has every setting the recipes turn on
    # an older build without decoupled_lr (its OptimizerConfig never had the field) is named, not an error
    monkeypatch.setitem(compat._RECIPE_HOMES, "decoupled_lr", ("megatron.core.optimizer", "OptimizerConfig_absent"))
    monkeypatch.setattr("megatron.core.optimizer.OptimizerConfig_absent", type("Old", (), {"__init__": lambda s: None}),
                        raising=False)
    with pytest.raises(compat.UnsupportedByBuild, match="OptimizerConfig_absent.decoupled_lr"):
        compat.check_recipe_settings(CONFIGS["gpt-recipe"])


@pytest.mark.nightly  # the gate's check runs PP 2 x DP 1 (pp2-vpp-gpt-recipe); this is its four-rank layout
def test_recipe_at_pp2_dp2_with_a_virtual_pipeline_is_bit_exact(tmp_path: Path) -> None:
    spec = RunSpec.from_dict({**RECIPE, "pp": 2, "workarounds": ["restore-adam-step", "match-groups-by-lr-bounds"]})
    r: dict[str, Any] = dict(run_parity(spec, tmp_path))
    assert r["verdict"] == "pass" and r["signatures"] == [], r["signatures"]
    assert all(s["loss_baseline"] == s["loss_resumed"] for s in r["steps"] if s["resumed_phase"])
    doc = _doc(tmp_path, "train_and_save")
    assert doc["info"]["layout"]["vpp"] == 2 and doc["info"]["layout"]["dp"] == 2
    # the chunks are one model to the probes: model0 holds the embedding on the first stage
    assert "model0.module.embedding.word_embeddings.weight" in doc["probes"]["state_at_save"][0]["model"]


def test_the_interleaved_schedule_is_wired_as_megatron_lms_trainer_wires_it() -> None:
    """Megatron-LM overlaps the interleaved schedule's P2P and so never batches it: batched, at PP 2 the previous and
    next stage are one peer, and the activation and grad sent to it at once arrive swapped (measured: every
    microbatch past the warmup trained on the other direction's tensor). A plain 1F1B pipeline keeps the batch."""
    from types import SimpleNamespace

    from jobs.rank.schedule import wire_trainer_config

    def chunk() -> Any:
        return SimpleNamespace(ddp_config=SimpleNamespace(overlap_grad_reduce=False))

    interleaved, plain = SimpleNamespace(), SimpleNamespace()
    wire_trainer_config(interleaved, [chunk(), chunk()])
    wire_trainer_config(plain, [chunk()])
    assert (interleaved.overlap_p2p_comm, interleaved.batch_p2p_comm) == (True, False)
    assert (plain.overlap_p2p_comm, plain.batch_p2p_comm) == (False, True)
