"""Megatron-Core main refuses the checkpoint its own `fully_sharded_model_space` format builds.

Run with the build under test importable (no harness, no GPU, one process):

    python docs/repros/fs_model_space_flattened_range.py

`DistributedOptimizer.sharded_param_state_fs_model_space` describes each optimizer-state shard as
the param's model ShardedTensor with `flattened_range=item_slice` (distrib_optimizer.py, "replace_kwargs
... flattened_range=item_slice"), but ShardedTensor's own validation (dist_checkpointing/mapping.py,
`validate_metadata_integrity`) now raises "ShardedTensor.flattened_range is not supported." for any
non-None range. This script builds the same kind of ShardedTensor the optimizer builds, in the same
way (dataclasses.replace of a model tensor's metadata), and shows the refusal: the format cannot be
saved on this build whatever the model, so a `checkpoint-save-crash, checkpoint-format-unsupported`
verdict for it is Megatron-Core's, not the harness's. Exit 0 when the build accepts the shard (the
bug is fixed), 1 when it refuses it.
"""

import inspect
import sys
from dataclasses import replace

import torch
from megatron.core import __version__
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

model_param = ShardedTensor.from_rank_offsets("decoder.weight", torch.zeros(4, 8))
builds_it = "flattened_range=item_slice" in inspect.getsource(DistributedOptimizer.sharded_param_state_fs_model_space)
print(f"megatron-core {__version__}: sharded_param_state_fs_model_space sets flattened_range: {builds_it}")
try:
    shard = replace(model_param, key="optimizer.state.exp_avg.decoder.weight", data=torch.zeros(16),
                    flattened_range=slice(0, 16))
    shard.validate_metadata_integrity()
except Exception as exc:  # noqa: BLE001 - the refusal is what this script shows
    print(f"refused: {type(exc).__name__}: {exc}")
    sys.exit(1)
print("accepted: this build saves fully_sharded_model_space shards")
