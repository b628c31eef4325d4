"""torch_dist distributed checkpoint save/load for a Trainee, split into build and I/O steps.

Building the sharded state dict is where the Bug A assertion fires; it is collective-free for
dp_reshardable, so the phase can agree across ranks on a build failure before any rank enters
the collective save (a rank that raised must not leave its peers waiting inside a collective).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from jobs.rank import compat, rng
from jobs.rank.model import Trainee
from jobs.rank.probes.index_map import distributed_optimizers
from jobs.rank.workarounds import adam_steps


def production_metadata(tr: Trainee, sharding: str) -> dict[str, Any] | None:
    """What Megatron-LM's trainer gives sharded_state_dict (_build_sharded_state_dict_metadata), or None.

    Asked for by a config (`checkpoint_metadata`): the optimizer sharding type, no singleton local
    shards, a chain's optimizers saved without the `chained_<i>` prefix, and the DP group.
    """
    if not tr.config.checkpoint_metadata or not compat.takes_metadata():
        return None
    return {**compat.sharding_kwargs(sharding)["metadata"], "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True, "dp_cp_group": _dp_group()}


def _model_and_optimizer(tr: Trainee, sharding: str, is_loading: bool) -> dict[str, Any]:
    metadata = production_metadata(tr, sharding)
    msd = tr.sharded_model_state(metadata)
    kwargs: dict[str, Any] = {"metadata": metadata} if metadata is not None else compat.sharding_kwargs(sharding)
    if is_loading:
        kwargs["is_loading"] = True
    return {"model": msd, "optimizer": tr.optimizer.sharded_state_dict(msd, **kwargs)}


def sharded_state(tr: Trainee, sharding: str) -> dict[str, Any]:
    """The model's and optimizer's sharded state dicts as a save in `sharding` builds them (nothing written)."""
    return _model_and_optimizer(tr, sharding, is_loading=False)


def build_save_state(tr: Trainee, sharding: str, iteration: int) -> dict[str, Any]:
    """Build the sharded state dict to save: model, optimizer, scheduler, iteration, RNG."""
    steps = adam_steps(tr.optimizer)
    return {
        **_model_and_optimizer(tr, sharding, is_loading=False),
        # Common (non-sharded) entries: written once by rank 0 into common.pt.
        "scheduler": tr.scheduler.state_dict(),
        "iteration": iteration,
        "adam_step": steps[-1] if steps else None,
        # Per rank: ranks' generators can differ, so this is not a common entry.
        rng.KEY: rng.sharded(),
        **_rerun_entry(tr),
    }


def _rerun_entry(tr: Trainee) -> dict[str, Any]:
    if not tr.config.rerun_state_machine:
        return {}
    from jobs.rank import rerun

    return {rerun.KEY: rerun.state_dict()}


def use_in_process_results_queue(synchronous: bool = True) -> bool:
    """Seed Megatron's write-results queue with an in-process queue for synchronous saves.

    A synchronous save runs the writer in this process, so the spawn-mode Manager queue only
    carries write results from this process to itself, and its server process must import torch
    to unpickle them (~1.5 s per rank on 2 cores). An in-process queue carries the same objects;
    the files written are identical. Opt out with PARITY_SAVE_MANAGER_QUEUE=1.
    """
    if os.environ.get("PARITY_SAVE_MANAGER_QUEUE") == "1":
        return False
    # the forked async writer reports through a queue another process can read; so does the
    # synchronous save of 0.12.x-0.14.x, which forks its writer too (compat.sync_save_forks)
    if not synchronous or compat.sync_save_forks():
        _own_results_manager()
        return False
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", "missing") is None:
        filesystem_async._results_queue = queue.Queue()
    return isinstance(getattr(filesystem_async, "_results_queue", None), queue.Queue)


def _dp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def save_strategy(fully_parallel: bool) -> Any:
    """The sharded save strategy: the default torch_dist one, or it inside Megatron's fully-parallel wrapper."""
    if not fully_parallel:
        return None
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    # each DP rank writes a distinct share of the replicated tensors instead of DP rank 0 writing them all
    return FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), _dp_group())


def load_strategy(fully_parallel: bool, folder: Path) -> Any:
    """The sharded load strategy: default, or Megatron's fully-parallel wrapper (each rank reads a share)."""
    if not fully_parallel:
        return None
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    return FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(str(folder)), _dp_group())


_MANAGERS: list[Any] = []


def _own_results_manager() -> None:
    """Give Megatron's write-results queue a Manager this module owns, so `finish_async` can stop it.

    Megatron creates its own (spawn) Manager and never shuts it down; a phase child leaves with
    os._exit, which skips the Manager's exit finalizer, so every async save left a server process
    (and its resource tracker) behind on each rank.
    """
    import multiprocessing as mp
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        # An abstract-namespace socket (Linux): the default is a file in TMPDIR, and a job's private
        # TMPDIR under its run folder is longer than AF_UNIX allows ("path too long" in every async save)
        address = f"\0parity-async-results-{os.getpid()}-{uuid.uuid4().hex}"
        # Forked on a CPU rank, as Megatron forks its writer: a spawned server imports torch to unpickle the
        # write results (1.5-2 s a rank on 2 cores, the async check's largest stage); a CUDA rank keeps spawn,
        # since a process forked after CUDA initialised must never touch it.
        from jobs.rank import device

        manager = SyncManager(address=address, ctx=mp.get_context("spawn" if device.is_cuda() else "fork"))
        manager.start()
        _MANAGERS.append(manager)
        filesystem_async._results_queue = manager.Queue()


def _stop_results_managers() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    while _MANAGERS:
        _MANAGERS.pop().shutdown()
        filesystem_async._results_queue = None


def write(state: dict[str, Any], folder: Path, fully_parallel: bool = False, asynchronous: bool = False) -> Any:
    """Save a built state dict with dist_checkpointing (a collective over all ranks).

    `asynchronous`: Megatron's real async path (`async_sharded_save=True`, the request scheduled on an
    AsyncCallsQueue: staged, then written by a forked process while training goes on); returns the
    queue, which the caller must finalize (`finish_async`). Otherwise returns None once written.
    """
    from megatron.core import dist_checkpointing

    try:  # every rank alike, before any collective of the save
        compat.check_writer()
    except compat.UnsupportedByBuild:
        _stop_results_managers()  # the queue's Manager (seeded before the write) would outlive the phase
        raise
    if torch.distributed.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    strategy = save_strategy(fully_parallel)
    if asynchronous:
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        request = dist_checkpointing.save(state, str(folder), strategy, async_sharded_save=True,
                                          **compat.async_save_kwargs())
        calls = AsyncCallsQueue()
        calls.schedule_async_request(request)
        return calls
    try:
        dist_checkpointing.save(state, str(folder), strategy)
    finally:  # a synchronous save that forked its writer (0.12.x-0.14.x) is over, written or failed
        _stop_results_managers()
    torch.distributed.barrier()
    return None


def finish_async(calls: Any, blocking: bool) -> bool:
    """Finalize a pending async save if done (or wait for it); True once nothing is pending."""
    calls.maybe_finalize_async_calls(blocking=blocking)
    done = not calls.async_calls
    if done:
        _stop_results_managers()
    if done and blocking:
        torch.distributed.barrier()
    return done


def build_load_state(tr: Trainee, sharding: str, with_rng: bool = True, folder: Path | None = None) -> dict[str, Any]:
    """Prime optimizer state and build the sharded state dict that load fills in.

    `with_rng=False` leaves the per-rank RNG states out: saved by another number of ranks (a
    resharded resume) they have no counterpart here, as Megatron-LM's `--no-load-rng` does; and the rerun
    state machine's per-rank part with them (Megatron-LM ignores it when the job's sharding changed). With
    `folder`, the checkpoint's common state says whether the machine's state must be asked for.
    """
    for opt in distributed_optimizers(tr.optimizer):
        # torch Adam has no state before its first step; DistributedOptimizer.state_dict()
        # asserts a single `step`, so Megatron-LM primes it with dummy values the same way.
        if len(opt.optimizer.state) == 0:
            compat.prime_optimizer_state(opt)
    state = _model_and_optimizer(tr, sharding, is_loading=True)
    if with_rng:
        state[rng.KEY] = rng.sharded()
        if folder is not None and tr.config.rerun_state_machine:
            from megatron.core import dist_checkpointing

            from jobs.rank import rerun

            state.update(rerun.load_template(dist_checkpointing.load_common_state_dict(str(folder)).get(rerun.KEY)))
    return state


def read(state: dict[str, Any], folder: Path, fully_parallel: bool = False) -> dict[str, Any]:
    """Load a checkpoint into the given sharded state dict (a collective over all ranks)."""
    from megatron.core import dist_checkpointing

    return dict(dist_checkpointing.load(state, str(folder), load_strategy(fully_parallel, folder)))


def apply(
    tr: Trainee,
    loaded: dict[str, Any],
    no_grad: bool,
    after_optimizer_load: Callable[[], None] | None = None,
) -> None:
    """Install loaded model, optimizer, scheduler, iteration and RNG state into the trainee.

    `after_optimizer_load` runs between the optimizer load and the scheduler load: the scheduler
    rewrites every group's lr and weight decay, so group metadata must be probed before it.
    """
    tr.ddp.module.load_state_dict(loaded["model"], strict=True)
    # Realigned maps expose the in-place copy into FP32 leaf views (PR #5835, second fix).
    guard = torch.no_grad() if no_grad else contextlib.nullcontext()
    with guard:
        tr.optimizer.load_state_dict(loaded["optimizer"])
    if after_optimizer_load is not None:
        after_optimizer_load()
    tr.scheduler.load_state_dict(loaded["scheduler"])
    tr.iteration = int(loaded["iteration"])
    if tr.config.rerun_state_machine:
        from jobs.rank import rerun

        rerun.load(loaded.get(rerun.KEY))
    # Last, so nothing the load did can consume random numbers after the restore.
    if rng.KEY in loaded:
        rng.restore(loaded[rng.KEY])


def checkpoint_step(loaded: dict[str, Any]) -> float | None:
    """Return the Adam step recorded in the checkpoint (param_groups first, then our own entry)."""
    steps: set[float] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for g in node.get("param_groups", []) if isinstance(node.get("param_groups"), list) else []:
                if isinstance(g, dict) and isinstance(g.get("step"), (int, float)):
                    steps.add(float(g["step"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(loaded.get("optimizer"))
    if len(steps) == 1:
        return steps.pop()
    value = loaded.get("adam_step")
    return float(value) if value is not None else None


def folder_bytes(folder: Path) -> int:
    """Return the total size of the files under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def describe(folder: Path) -> dict[str, Any]:
    """Return the checkpoint's path, size and file list for the result document."""
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []
    return {"path": os.fspath(folder), "bytes": folder_bytes(folder), "files": files}
