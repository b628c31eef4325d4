"""The Megatron-Core surface a resume must honour, read from the build installed here at call time.

Each section lists the names a user can set (or a resume restores): the DDP config, the optimizer config, the LR
scheduler's arguments, the transformer settings of the areas the gate's configs vary (`in_scope`) and the training
loop's saved state. `jobs/surface_table.py` (pure) classifies every name against the gate; a name a newer build adds
shows there as uncovered. Run as `python -m jobs.rank.surface` with an environment's Python to print the JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import sys
from typing import Any

# TransformerConfig names of the areas the gate's configs vary: MoE, MTP, embeddings and precision, plus the
# parallel layout (the sizes and sequence_parallel) that decides how each rank's checkpoint shards are cut
AREA_PREFIXES = ("moe_", "mtp_", "fp8", "fp4", "fp16", "bf16", "fp32")
AREA_NAMES = frozenset({
    "params_dtype", "pipeline_dtype", "autocast_dtype", "calculate_per_token_loss", "num_moe_experts",
    "first_k_dense_replace", "share_embeddings_and_output_weights", "gated_linear_unit", "activation_func",
    "normalization",
})
# What Megatron-LM's training loop saves beside model and optimizer and a resume restores
# (megatron/training/checkpointing.py, generate_state_dict / load_checkpoint; megatron/training is not part of
# megatron-core, so the list is fixed here).
TRAINING_STATE = (
    "iteration",
    "num_floating_point_operations_so_far",
    "opt_param_scheduler",
    "rng_state",
    "rerun_state_machine",
    "consumed_train_samples",
    "checkpoint_version",
)


def in_scope(name: str) -> bool:
    """Whether a TransformerConfig field is in the gate's areas (MoE, MTP, embeddings, precision, parallel layout)."""
    # init methods only shape a fresh model's first weights, which a resume overwrites from the checkpoint
    if "init_method" in name:
        return False
    # "expert" catches MoE names without the moe_ prefix (use_grouped_gemm_for_shared_expert)
    layout = name.endswith("_parallel_size") or name == "sequence_parallel"
    return name.startswith(AREA_PREFIXES) or "expert" in name or "embedding" in name or layout or name in AREA_NAMES


def dataclass_fields(cls: Any) -> list[str]:
    """The field names of a dataclass, inherited ones included, in definition order."""
    return [f.name for f in dataclasses.fields(cls)]


def optimizer_config_class() -> Any:
    """The config class get_megatron_optimizer takes (the base, where a build has per-optimizer subclasses)."""
    from megatron.core import optimizer

    annotation = inspect.signature(optimizer.get_megatron_optimizer).parameters["config"].annotation
    # a string annotation (postponed evaluation) names the class the module exports
    if isinstance(annotation, str):
        annotation = getattr(optimizer, annotation, None)
    return annotation if dataclasses.is_dataclass(annotation) else optimizer.OptimizerConfig


def scheduler_arguments() -> list[str]:
    """OptimizerParamScheduler's keyword arguments (the optimizer it wraps is not a setting)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    params = inspect.signature(OptimizerParamScheduler.__init__).parameters
    return [name for name in params if name not in ("self", "optimizer")]


def read_surface() -> dict[str, list[str]]:
    """{section: names} of the installed Megatron-Core: ddp, optimizer, scheduler, transformer, training_state."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    return {
        "ddp": dataclass_fields(DistributedDataParallelConfig),
        "optimizer": dataclass_fields(optimizer_config_class()),
        "scheduler": scheduler_arguments(),
        "transformer": [name for name in dataclass_fields(TransformerConfig) if in_scope(name)],
        "training_state": list(TRAINING_STATE),
    }


def main() -> None:
    """Print the installed build's surface as JSON on stdout (the only thing written there)."""
    # importing Megatron may print; keep stdout the JSON document alone
    with contextlib.redirect_stdout(sys.stderr):
        surface = read_surface()
    json.dump(surface, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
