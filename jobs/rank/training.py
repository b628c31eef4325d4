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
    FINGERPRINTS,
    INDEX_MAP,
    INDEX_MAP_EFFECTIVE,
    LOAD_NO_GRAD,
    PARAM_GROUPS,
    REALIGN,
    RESTORE_STEP,
    Moment,
    StepRecord,
)
from jobs.rank import checkpoint, compat, dist, model
from jobs.rank.context import RankContext
from jobs.rank.probes import buckets, fingerprints, groups, index_map
from jobs.rank.workarounds import adam_steps, realign_param_index, restore_adam_step
from jobs.spec import RunSpec

PROBE_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 120.0


def _gather(ctx: RankContext, value: Any) -> list[Any]:
    return ctx.run("probe", lambda: dist.gather(value), PROBE_TIMEOUT_S)


def build(ctx: RankContext, spec: RunSpec) -> model.Trainee:
    """Build the trainee; probe the index map and buckets; apply realign-param-index if asked."""
    compat.check_spec(spec)  # an option this build lacks is unsupported-by-build, before anything runs
    ctx.doc["info"]["compat_shims"] = compat.install_shims()
    tr = model.build(get_config(spec.config), spec.seed, spec.steps)
    # Local reports wait here until the first collective stage gathers them (_publish_build_probes).
    ctx.local_build_probes = {
        INDEX_MAP: compat.guarded(index_map.probe, optimizers=[], misaligned_total=0)(tr.optimizer, tr.name_of),
        BUCKETS: compat.guarded(buckets.probe, buffers=[], unaligned_total=0)(tr.ddp, tr.name_of),
    }
    if REALIGN in spec.workarounds:
        ctx.doc["workarounds"][REALIGN] = realign_param_index(tr.optimizer)
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
    """Load the step-N checkpoint into fresh state, apply restore workarounds, probe the result."""
    _publish_build_probes(ctx)
    t0 = time.perf_counter()
    state = ctx.run("load", lambda: checkpoint.build_load_state(tr, spec.sharding), timeout_s, agree=True)
    loaded = ctx.run("load", lambda: checkpoint.read(state, ckpt), timeout_s, agree=True)
    no_grad = REALIGN in spec.workarounds or LOAD_NO_GRAD in spec.workarounds
    ctx.run("load", lambda: checkpoint.apply(tr, loaded, no_grad=no_grad), timeout_s, agree=True)
    if no_grad:
        ctx.doc["workarounds"][LOAD_NO_GRAD] = True
    info = ctx.doc["info"]
    info["load_seconds"] = round(time.perf_counter() - t0, 4)
    info["checkpoint"] = checkpoint.describe(ckpt)
    ck_step = checkpoint.checkpoint_step(loaded)
    info["checkpoint_adam_step"] = ck_step
    info["adam_steps_after_load"] = adam_steps(tr.optimizer)
    info["scheduler_num_steps_after_load"] = int(tr.scheduler.num_steps)
    if RESTORE_STEP in spec.workarounds:
        if ck_step is None:
            ctx.doc["workarounds"][RESTORE_STEP] = {"name": RESTORE_STEP, "skipped": "no step in checkpoint"}
        else:
            ctx.doc["workarounds"][RESTORE_STEP] = restore_adam_step(tr.optimizer, ck_step)
    _state_probe(ctx, tr, "after_load", with_slots=False)


def _save(ctx: RankContext, tr: model.Trainee, spec: RunSpec, step: int, ckpt: Path, timeout_s: float) -> None:
    # Evidence first: if the save crashes, the fingerprints still show what it would have written.
    _state_probe(ctx, tr, "at_save", with_slots=True)
    t0 = time.perf_counter()
    state = ctx.run("save", lambda: checkpoint.build_save_state(tr, spec.sharding, step), timeout_s, agree=True)
    t1 = time.perf_counter()
    in_process = checkpoint.use_in_process_results_queue()
    ctx.run("save", lambda: checkpoint.write(state, ckpt), timeout_s, agree=True)
    info = ctx.doc["info"]
    info["save_results_queue"] = "in-process" if in_process else "multiprocessing-manager"
    info["save_build_seconds"] = round(t1 - t0, 4)
    info["save_seconds"] = round(time.perf_counter() - t0, 4)
    info["checkpoint"] = checkpoint.describe(ckpt)


def _one_step(tr: model.Trainee, step: int, world: int) -> StepRecord:
    t0 = time.perf_counter()
    lr = float(tr.optimizer.param_groups[0]["lr"])  # the lr this step applies
    tr.ddp.zero_grad_buffer()
    tr.optimizer.zero_grad()
    loss = tr.loss_fn(step)
    loss.backward()
    tr.ddp.finish_grad_sync()
    ok, grad_norm, num_zeros = tr.optimizer.step()
    tr.scheduler.step(increment=1)
    mean = loss.detach().clone().float()
    torch.distributed.all_reduce(mean)
    mean /= world
    return {
        "step": step,
        "loss": float(mean),
        "lr": lr,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "num_zeros": None if num_zeros is None else int(num_zeros),
        "update_successful": bool(ok),
        "wall_s": round(time.perf_counter() - t0, 5),
    }


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
    world = torch.distributed.get_world_size()
    t0 = time.perf_counter()
    for step in range(first, spec.steps + 1):
        record = ctx.run("step", functools.partial(_one_step, tr, step, world), STEP_TIMEOUT_S)
        ctx.doc["steps"].append(record)
        if step == save_at:
            ctx.doc["info"]["train_seconds_before_save"] = round(time.perf_counter() - t0, 4)
            _save(ctx, tr, spec, step, ckpt, save_timeout_s)
    ctx.doc["info"]["train_seconds"] = round(time.perf_counter() - t0, 4)
