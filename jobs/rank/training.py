"""The body of a phase on one rank: build (+ probes, workarounds), load, train, save.

Every probe runs locally on each rank and is gathered to all ranks with one collective, so rank
0's document carries every rank's evidence.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import torch

from jobs.configs import get_config
from jobs.contract import (
    BUCKETS,
    CHECKPOINT_CONTENTS,
    FINGERPRINTS,
    FP32_VIEW_INPLACE,
    GROUPS_AFTER_OPTIMIZER_LOAD,
    INDEX_MAP,
    INDEX_MAP_EFFECTIVE,
    LOAD_ABSENT_STEP,
    LOAD_NO_GRAD,
    MATCH_GROUPS,
    PARAM_GROUPS,
    REALIGN,
    RESTORE_STEP,
    STATE_AFTER_LOAD,
    STATE_AFTER_LOAD_RAW,
    STATE_AFTER_SAVE,
    STATE_AT_SAVE,
    STATE_BEFORE_LOAD,
    STATE_FINAL,
    STATE_FINAL_DELTAS,
    Moment,
    StepRecord,
)
from jobs.rank import checkpoint, compat, dist, model
from jobs.rank import device as rank_device
from jobs.rank.context import RankContext, hold_if_asked
from jobs.rank.probes import (
    applied,
    buckets,
    checkpoint_contents,
    final_numeric,
    fingerprints,
    global_state,
    groups,
    index_map,
    layout_view,
)
from jobs.rank.probes import state as state_probe
from jobs.rank.workarounds import (
    adam_steps,
    fp32_leaf_views,
    group_identity_collisions,
    load_absent_step,
    match_groups_by_lr_bounds,
    name_unexplained,
    realign_param_index,
    restore_adam_step,
    shared_step_params,
)
from jobs.shape import apply_shape
from jobs.spec import RESHARDABLE_ACROSS_MODEL_LAYOUTS, RunSpec

PROBE_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 120.0


def _gather(ctx: RankContext, value: Any) -> list[Any]:
    return ctx.run("probe", lambda: dist.gather(value), PROBE_TIMEOUT_S)


def _snapshots(ctx: RankContext, tr: model.Trainee, spec: RunSpec) -> list[dict[str, Any]]:
    """Every rank's state snapshot; when the run reshards, one view of the whole DP group instead.

    Saved and restored state then compare item by item although other ranks hold other shards.
    """
    if spec.layout_free_view:  # model parallelism on either side: tensors by checkpoint key and global offset
        gather = functools.partial(_gather, ctx)
        return [layout_view.layout_free_snapshot(tr, _layout_free_tensors(ctx, tr, spec), gather)]
    if spec.reshards:
        return [global_state.global_snapshot(tr, functools.partial(_gather, ctx))]
    return _gather(ctx, state_probe.snapshot(tr))


def _layout_free_tensors(ctx: RankContext, tr: model.Trainee, spec: RunSpec) -> dict[str, Any] | None:
    """Every checkpointed tensor whole, by section, on rank 0 (None elsewhere; a collective)."""
    state = checkpoint.sharded_state(tr, RESHARDABLE_ACROSS_MODEL_LAYOUTS)  # param-keyed, whatever was saved
    return layout_view.global_tensors(tr, state, functools.partial(_gather, ctx), spec.shared_vocab_rows)


def resume_init_seed(seed: int) -> int:
    """The seed a resume builds its model from: never the saving run's, so no restore is implicit."""
    return (seed + 1_000_003) % 2**63


def build(ctx: RankContext, spec: RunSpec, phase: str = "train_and_save") -> model.Trainee:
    """Build the trainee; probe the index map and buckets; apply realign-param-index if asked.

    A resume builds from a different seed: a state the load fails to restore then differs from
    the saved one whatever the save step (at step 1 the weights would otherwise still equal a
    fresh build's, since warm-up starts at lr 0).
    """
    compat.check_spec(spec)  # an option this build lacks is unsupported-by-build, before anything runs
    ctx.doc["info"]["compat_shims"] = compat.install_shims()
    ctx.doc["info"]["capabilities"] = compat.capabilities()  # what the harness found in this build, per run
    init_seed = resume_init_seed(spec.seed) if phase == "resume" else None
    layout = spec.layout(phase)
    tr = model.build(
        apply_shape(get_config(spec.config), spec.shape), spec.seed, spec.steps, init_seed,
        tp=layout.tp, ep=layout.ep, pp=layout.pp, global_microbatches=spec.global_microbatches,
    )
    # Local reports wait here until the first collective stage gathers them (_publish_build_probes).
    ctx.local_build_probes = {
        INDEX_MAP: compat.guarded(index_map.probe, optimizers=[], misaligned_total=0)(tr.optimizer, tr.name_of),
        BUCKETS: compat.guarded(buckets.probe, buffers=[], unaligned_total=0)(tr.ddp, tr.name_of),
    }
    if REALIGN in spec.workarounds:
        ctx.doc["workarounds"][REALIGN] = name_unexplained(realign_param_index(tr.optimizer), tr.name_of)
        ctx.local_build_probes[INDEX_MAP_EFFECTIVE] = index_map.probe(tr.optimizer, tr.name_of)
    return tr


def _publish_build_probes(ctx: RankContext) -> None:
    local, ctx.local_build_probes = ctx.local_build_probes, None
    per_rank = _gather(ctx, local)
    probes = ctx.doc["probes"]
    for key in (INDEX_MAP, INDEX_MAP_EFFECTIVE):
        if key in per_rank[0]:
            probes[key] = {
                "applicable": per_rank[0][key]["applicable"],
                "misaligned_total": sum(r[key]["misaligned_total"] for r in per_rank),
                "unexplained_total": sum(r[key].get("unexplained_total", 0) for r in per_rank),
                "per_rank": [r[key] for r in per_rank],
            }
    probes[BUCKETS] = {
        "applicable": per_rank[0][BUCKETS]["applicable"],
        "unaligned_total": sum(r[BUCKETS]["unaligned_total"] for r in per_rank),
        "per_rank": [r[BUCKETS] for r in per_rank],
    }
    # not applicable on this build: say why, once
    if "reason" in per_rank[0][INDEX_MAP] and INDEX_MAP in probes:
        probes[INDEX_MAP]["reason"] = per_rank[0][INDEX_MAP]["reason"]
    if "reason" in per_rank[0][BUCKETS]:
        probes[BUCKETS]["reason"] = per_rank[0][BUCKETS]["reason"]
    if REALIGN in ctx.doc["workarounds"]:
        reports = _gather(ctx, ctx.doc["workarounds"][REALIGN])
        ctx.doc["workarounds"][REALIGN] = {
            "corrected_total": sum(r["corrected_total"] for r in reports),
            "unexplained_total": sum(r.get("unexplained_total", 0) for r in reports),
            "needed": any(r.get("needed", r["corrected_total"] > 0) for r in reports),
            "per_rank": reports,
        }


def _state_probe(ctx: RankContext, tr: model.Trainee, moment: Moment, with_slots: bool) -> None:
    local = {
        "owned": fingerprints.owned(tr.optimizer, tr.name_of),
        "slots": fingerprints.slots(tr.optimizer, tr.name_of) if with_slots else None,
        "groups": groups.local_groups(tr.optimizer),
    }
    per_rank = _gather(ctx, local)
    ctx.doc["probes"][FINGERPRINTS[moment]] = {
        "owned": [r["owned"] for r in per_rank],
        "slots": [r["slots"] for r in per_rank] if with_slots else None,
    }
    agreement = groups.check_agreement([r["groups"] for r in per_rank])
    ctx.doc["probes"][PARAM_GROUPS[moment]] = {
        "agree": agreement["agree"],
        "disagreements": agreement["disagreements"],
        "empty_rank_groups": agreement["empty_rank_groups"],
        "per_rank": [r["groups"] for r in per_rank],
    }


def load(ctx: RankContext, tr: model.Trainee, spec: RunSpec, ckpt: Path, timeout_s: float) -> None:
    """Load the step-N checkpoint into fresh state, apply restore workarounds, probe the result.

    State is snapshotted right after the load (before any workaround) and again after the
    workarounds, so the verdict can say what each workaround hid.
    """
    _publish_build_probes(ctx)
    no_grad = REALIGN in spec.workarounds or LOAD_NO_GRAD in spec.workarounds
    local: dict[str, Any] = {}
    if no_grad:  # before the load: the trial must see the shards as the build left them
        local["fp32_view"] = fp32_leaf_views(tr.optimizer, tr.name_of)
    # groups this build's load cannot tell apart (the evidence of the known bug, workaround or not), read
    # before the load state is built: building it already matches the groups
    ctx.doc["info"]["param_group_identity"] = group_identity_collisions(tr.optimizer)
    if MATCH_GROUPS in spec.workarounds:
        ctx.doc["workarounds"][MATCH_GROUPS] = match_groups_by_lr_bounds(tr.optimizer)
    t0 = time.perf_counter()
    # Per-rank RNG state cannot be resharded (the spec refuses configs that draw random numbers).
    with_rng = not spec.reshards
    state = ctx.run(
        "load", lambda: checkpoint.build_load_state(tr, spec.sharding, with_rng, ckpt), timeout_s, agree=True
    )
    primed = adam_steps(tr.optimizer)  # what the load priming left: the value the known step bug keeps
    if LOAD_ABSENT_STEP in spec.workarounds:
        ctx.doc["workarounds"][LOAD_ABSENT_STEP] = load_absent_step(tr.optimizer)
    # Before the read (torch_dist fills model tensors in place): what a skipped item keeps, and what
    # the load asks the checkpoint for, so the verdict can say how each lost item was lost.
    before_view = _snapshots(ctx, tr, spec) if spec.reshards else None
    local["before"] = None if spec.reshards else state_probe.snapshot(tr)
    local["requested"] = checkpoint_contents.requested_model_keys(tr.ddp.module, state["model"])
    loaded = ctx.run("load", lambda: checkpoint.read(state, ckpt, spec.fully_parallel), timeout_s, agree=True)

    def groups_now() -> None:  # Bug C: before the scheduler rewrites lr / weight decay
        # on another layout the groups' indices differ: keyed by what identifies a group, as the view is
        local["groups"] = (layout_view.group_values(tr.optimizer) if spec.layout_free_view
                           else state_probe.param_groups(tr.optimizer))

    ctx.run(
        "load",
        lambda: checkpoint.apply(tr, loaded, no_grad=no_grad, after_optimizer_load=groups_now),
        timeout_s,
        agree=True,
    )
    if no_grad:
        ctx.doc["workarounds"][LOAD_NO_GRAD] = True
    if LOAD_ABSENT_STEP in spec.workarounds:
        report = ctx.doc["workarounds"][LOAD_ABSENT_STEP]
        report["needed"] = report["params"] > 0
    info = ctx.doc["info"]
    info["load_seconds"] = round(time.perf_counter() - t0, 4)
    info["checkpoint"] = checkpoint.describe(ckpt)
    info["restored_iteration"] = tr.iteration
    ck_step = checkpoint.checkpoint_step(loaded)
    info["checkpoint_adam_step"] = ck_step
    info["adam_steps_after_load"] = adam_steps(tr.optimizer)
    info["adam_step_shared_after_load"] = shared_step_params(tr.optimizer)
    info["scheduler_num_steps_after_load"] = int(tr.scheduler.num_steps)
    raw = None if spec.reshards else state_probe.snapshot(tr)
    raw_view = _snapshots(ctx, tr, spec) if spec.reshards else None
    after_view: list[dict[str, Any]] | None = None
    if RESTORE_STEP in spec.workarounds:
        if ck_step is None:
            ctx.doc["workarounds"][RESTORE_STEP] = {"name": RESTORE_STEP, "skipped": "no step in checkpoint"}
        else:
            ctx.doc["workarounds"][RESTORE_STEP] = restore_adam_step(tr.optimizer, ck_step, primed)
        local["after"] = None if spec.reshards else state_probe.snapshot(tr)
        after_view = _snapshots(ctx, tr, spec) if spec.reshards else None
    local["raw"] = raw
    per_rank = _gather(ctx, local)
    probes = ctx.doc["probes"]
    probes[STATE_AFTER_LOAD_RAW] = raw_view or [r["raw"] for r in per_rank]
    probes[STATE_BEFORE_LOAD] = before_view or [r["before"] for r in per_rank]
    if ctx.rank == 0:  # one listing of the checkpoint, every rank's request
        keys, incomplete = checkpoint_contents.checkpoint_keys(ckpt)
        probes[CHECKPOINT_CONTENTS] = checkpoint_contents.report(keys, incomplete, [r["requested"] for r in per_rank])
    if "after" in local:
        probes[STATE_AFTER_LOAD] = after_view or [r["after"] for r in per_rank]
    probes[GROUPS_AFTER_OPTIMIZER_LOAD] = ([layout_view.union([r["groups"] for r in per_rank])] if spec.layout_free_view
                                           else [r["groups"] for r in per_rank])
    if no_grad:
        probes[FP32_VIEW_INPLACE] = [r["fp32_view"] for r in per_rank]
    _state_probe(ctx, tr, "after_load", with_slots=False)


def _save(ctx: RankContext, tr: model.Trainee, spec: RunSpec, step: int, ckpt: Path, timeout_s: float) -> None:
    # Megatron-LM's trainer gathers the params the last step updated before it saves (and turns the
    # deferred gather back on after): a checkpoint of whole, current params
    tr.gather_params()
    # Evidence first: if the save crashes, the fingerprints still show what it would have written.
    _state_probe(ctx, tr, "at_save", with_slots=True)
    ctx.doc["probes"][STATE_AT_SAVE] = _snapshots(ctx, tr, spec)
    t0 = time.perf_counter()
    state = ctx.run("save", lambda: checkpoint.build_save_state(tr, spec.sharding, step), timeout_s, agree=True)
    t1 = time.perf_counter()
    in_process = checkpoint.use_in_process_results_queue(synchronous=not spec.async_save)
    ctx.pending_save = ctx.run(
        "save", lambda: checkpoint.write(state, ckpt, spec.fully_parallel, spec.async_save), timeout_s, agree=True
    )
    info = ctx.doc["info"]
    info["save_results_queue"] = "in-process" if in_process else "multiprocessing-manager"
    info["save_build_seconds"] = round(t1 - t0, 4)
    info["save_seconds"] = round(time.perf_counter() - t0, 4)
    if spec.async_save or spec.fully_parallel:
        info["save_strategy"] = {"async": spec.async_save, "fully_parallel": spec.fully_parallel}
    if ctx.pending_save is None:
        info["checkpoint"] = checkpoint.describe(ckpt)
    # Saving must not change the live run: the same snapshot again, right after the write.
    ctx.doc["probes"][STATE_AFTER_SAVE] = _snapshots(ctx, tr, spec)
    tr.regather_params_in_forward()


def _async_saved(ctx: RankContext, ckpt: Path, step: int) -> None:
    ctx.pending_save = None
    ctx.doc["info"]["checkpoint"] = checkpoint.describe(ckpt)
    ctx.doc["info"]["async_save_finalized_after_step"] = step


def _accumulate(tr: model.Trainee, step: int, micro: int) -> torch.Tensor:
    """Forward/backward this rank's `micro` microbatches of the global batch; return their mean loss.

    Rank r holds global microbatches r*micro .. r*micro+micro-1, so every DP size with the same
    global batch trains on the same samples. Each loss is scaled by 1/micro (as Megatron's
    schedules do), the MoE aux loss too, so the gradient is the mean over the rank's microbatches.
    """
    from megatron.core import parallel_state

    assert tr.micro_loss_fn is not None
    rank = parallel_state.get_data_parallel_rank()
    _set_aux_loss_scale(1.0 / micro)
    _set_mtp_loss_scale(tr, micro)
    total = torch.zeros((), dtype=torch.float32, device=rank_device.current())
    for j in range(micro):
        loss = tr.micro_loss_fn(step, rank * micro + j) / micro
        tr.backward(loss)
        total += loss.detach().float()
    return total


def _set_aux_loss_scale(scale: float) -> None:
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=rank_device.current()))


def _set_mtp_loss_scale(tr: model.Trainee, micro: int) -> None:
    """Scale the MTP loss's backward as Megatron's schedules do (forward_step: loss scale / microbatches).

    The MTP loss is not part of the returned loss: GPTModel attaches it to the hidden states with
    MTPLossAutoScaler, whose backward injects this scale as the MTP loss's gradient.
    """
    if not tr.config.mtp_num_layers:
        return
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    scale = tr.optimizer.get_loss_scale().float() if tr.config.fp16 else torch.ones((), device=rank_device.current())
    MTPLossAutoScaler.set_loss_scale(scale / micro)


def _mtp_losses(tr: model.Trainee, micro: int) -> list[float] | None:
    """This step's MTP losses per depth, averaged over DP (what Megatron-LM's training log shows).

    GPTModel records them in MTPLossLoggingHelper's tracker; track_mtp_metrics would all-reduce with
    ReduceOp.AVG, which gloo lacks, so the sum over the DP group is divided here, then the tracker
    cleaned as track_mtp_metrics does.
    """
    if not tr.config.mtp_num_layers:
        return None
    from megatron.core import parallel_state
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    if "values" not in tracker:  # a pipeline stage without the head
        return None
    values = tracker["values"].detach().clone().float() / micro
    torch.distributed.all_reduce(values, group=parallel_state.get_data_parallel_group())
    values /= parallel_state.get_data_parallel_world_size()
    MTPLossLoggingHelper.clean_loss_in_tracker()
    return [float(v) for v in values]


def _forward_backward(tr: model.Trainee, step: int, micro: int) -> torch.Tensor:
    """Zero the grads, run the step's forward and backward and reduce the grads; -> this rank's loss."""
    tr.ddp.zero_grad_buffer()
    tr.optimizer.zero_grad()
    _set_mtp_loss_scale(tr, micro)
    if tr.scheduled is not None:  # a recipe-shaped config: Megatron's schedule, which reduces the grads too
        return tr.scheduled(step, micro)
    if micro == 1:  # every run at one DP size
        loss, _ = tr.forward_backward(step)  # a pipeline stage before the last contributes 0
    else:  # a resharded run (tp = pp = 1): this rank's share of the global batch
        loss = _accumulate(tr, step, micro)
    tr.sync_grads()
    return loss


def _one_step(tr: model.Trainee, step: int, holders: int, micro: int = 1) -> StepRecord:
    """One training step; the recorded loss is the mean over the `holders` ranks that compute it."""
    t0 = time.perf_counter()
    lr = float(tr.optimizer.param_groups[0]["lr"])  # the lr this step applies
    if tr.config.rerun_state_machine:  # as Megatron-LM's train_step: inside the machine, which may rerun it
        from jobs.rank import rerun

        loss = rerun.run_step(functools.partial(_forward_backward, tr, step, micro))
    else:
        loss = _forward_backward(tr, step, micro)
    scalars = applied.applied_scalars(tr.optimizer)  # what this update applies, group by group
    ok, grad_norm, num_zeros = tr.optimizer.step()
    tr.scheduler.step(increment=tr.scheduler_increment(bool(ok), micro))
    tr.iteration = step
    mean = loss.detach().clone().float()
    torch.distributed.all_reduce(mean)
    mean /= holders
    mtp = _mtp_losses(tr, micro)
    record: StepRecord = {
        "step": step,
        "loss": float(mean),
        "lr": lr,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "num_zeros": None if num_zeros is None else int(num_zeros),
        "update_successful": bool(ok),
        "wall_s": round(time.perf_counter() - t0, 5),
        "applied": scalars,
    }
    if mtp is not None:
        record["mtp_loss"] = mtp
    return record


def run_steps(
    ctx: RankContext,
    tr: model.Trainee,
    spec: RunSpec,
    first: int,
    save_at: int | None,
    ckpt: Path,
    save_timeout_s: float,
) -> None:
    """Run steps first..M, recording each; save the checkpoint after step `save_at`."""
    if ctx.local_build_probes is not None:
        _publish_build_probes(ctx)
    from megatron.core import parallel_state

    # every rank but the earlier pipeline stages computes the loss: world / pp of them
    holders = torch.distributed.get_world_size() // parallel_state.get_pipeline_model_parallel_world_size()
    # the same global batch at every DP size (1 microbatch per rank unless the run reshards)
    dp_size = parallel_state.get_data_parallel_world_size()
    micro, rest = divmod(spec.global_microbatches, dp_size)
    if rest or micro < 1:
        raise RuntimeError(f"DP size {dp_size} does not divide the global batch of {spec.global_microbatches}")
    ctx.doc["info"]["microbatches_per_rank"] = micro
    t0 = time.perf_counter()
    if ctx.doc["phase"] == "resume":  # the trainer's first step after a load runs with the deferred gather off
        tr.start_resume_without_gather()
    for step in range(first, spec.steps + 1):
        record = ctx.run("step", functools.partial(_one_step, tr, step, holders, micro), STEP_TIMEOUT_S)
        tr.regather_params_in_forward()
        ctx.doc["steps"].append(record)
        hold_if_asked(ctx.folder, ctx.rank, step)
        if ctx.pending_save is not None:  # an async save: training went on; finalize it once written
            poll = functools.partial(checkpoint.finish_async, ctx.pending_save, blocking=False)
            if ctx.run("save", poll, save_timeout_s):
                _async_saved(ctx, ckpt, step)
        if step == save_at:
            ctx.doc["info"]["train_seconds_before_save"] = round(time.perf_counter() - t0, 4)
            _save(ctx, tr, spec, step, ckpt, save_timeout_s)
    if ctx.pending_save is not None:
        ctx.run("save", functools.partial(checkpoint.finish_async, ctx.pending_save, blocking=True), save_timeout_s)
        _async_saved(ctx, ckpt, spec.steps)
    ctx.doc["info"]["train_seconds"] = round(time.perf_counter() - t0, 4)
    # After step M in both runs: what the update of the last step left behind (whole params, as a save
    # would see them, where the all-gather was deferred to a next forward that never comes).
    tr.gather_params()
    if spec.layout_free_view:  # assembled once for both the view and the numeric copy (seconds on CPU)
        by_section = _layout_free_tensors(ctx, tr, spec)
        ctx.doc["probes"][STATE_FINAL] = [layout_view.layout_free_snapshot(tr, by_section,
                                                                           functools.partial(_gather, ctx))]
    else:
        by_section = None
        ctx.doc["probes"][STATE_FINAL] = _snapshots(ctx, tr, spec)
    _final_numeric(ctx, tr, spec, ckpt, by_section)


def _final_numeric(ctx: RankContext, tr: model.Trainee, spec: RunSpec, ckpt: Path,
                   by_section: dict[str, Any] | None = None) -> None:
    """Write this phase's final tensors; on the resume, measure how far they are from the saving run's.

    The saving run's attempt folder holds the checkpoint (`<attempt>/checkpoint/stepN`), so the
    resume finds the baseline's file there; the save phase has always finished by then.
    """
    if spec.layout_free_view:  # by_section: _layout_free_tensors' answer (None on ranks other than 0)
        tensors = None if by_section is None else {
            f"{section}/{key}": value.float() for section, items in by_section.items()
            if section != layout_view.VOCAB for key, value in items.items() if isinstance(value, torch.Tensor)}
    elif spec.reshards:
        tensors = final_numeric.global_tensors(tr, functools.partial(_gather, ctx))
    else:
        tensors = final_numeric.local_tensors(tr)
    final_numeric.write(tensors, ctx.folder, ctx.rank, spec.reshards)
    if ctx.doc["phase"] != "resume":
        return
    local = final_numeric.compare_with_baseline(tensors, ckpt.parent.parent, ctx.rank, spec.reshards)
    ctx.doc["probes"][STATE_FINAL_DELTAS] = final_numeric.report(_gather(ctx, local), spec.reshards)  # type: ignore[typeddict-item]
