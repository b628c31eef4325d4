"""RNG state a resume must restore: torch CPU, CUDA when present, Megatron's RNG tracker.

Saved per rank as a ShardedObject in the torch_dist checkpoint (ranks' states can differ) and set
back right after the load, so dropout draws the same masks in the resumed run as in the
uninterrupted one. Megatron-LM's trainer does the same; megatron-core leaves it to the trainer.
"""

from __future__ import annotations

from typing import Any

import torch

KEY = "rng_state"


def _tracker() -> Any:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return get_cuda_rng_tracker()


def capture() -> dict[str, torch.Tensor]:
    """Return copies of this rank's RNG states, keyed by generator."""
    from jobs.rank.device import is_cuda

    states = {"torch_cpu": torch.get_rng_state()}
    if is_cuda():  # a cuda rank's dropout draws from its GPU's generator (a CPU byte tensor either way)
        states["cuda"] = torch.cuda.get_rng_state()
    for name, state in sorted(_tracker().get_states().items()):
        states[f"tracker/{name}"] = state.clone()
    return states


def restore(states: dict[str, torch.Tensor]) -> None:
    """Set this rank's RNG states from `capture()`'s output."""
    torch.set_rng_state(states["torch_cpu"])
    from jobs.rank.device import is_cuda

    if "cuda" in states and is_cuda():
        torch.cuda.set_rng_state(states["cuda"])
    tracker = {k.removeprefix("tracker/"): v.clone() for k, v in states.items() if k.startswith("tracker/")}
    if tracker:
        _tracker().set_states(tracker)


def sharded(states: dict[str, torch.Tensor] | None = None) -> Any:
    """Wrap this rank's RNG states (or a placeholder to load into) as a per-rank ShardedObject."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return ShardedObject(KEY, states if states is not None else capture(), (world,), (rank,), replica_id=0)
