"""Coverage measured against Megatron-Core's surface, not the engine's (pure; no torch).

`jobs/rank/surface.py` reads the names a build offers (DDP config, optimizer config, the LR scheduler's arguments,
the MoE / MTP / embedding / precision / layout part of TransformerConfig, the training loop's saved state). Here
each `"<section>.<field>"` is classified once: exercised by an engine feature (`jobs/features.py`; covered when a
gate check exercises it), set by the engine in every run, or a written reason why no CPU gate check must exercise
it; a field that changes what a checkpoint holds or how a load restores it and that the engine does not exercise
yet is an explicit `KNOWN_GAPS` entry. A field the build has and neither table knows is `uncovered`: that is how a
field new in a later build shows up. The table covers 0.16.1 and Megatron-LM main (0.20); `stale()` lists the
names a build lacks. `python -m jobs.surface_table` prints the table (docs/detection.md carries it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs import features
from jobs.selftest import option_coverage
from jobs.spec import RunSpec

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "suites" / "gate.yaml"
DOC = ROOT / "docs" / "detection.md"
BEGIN, END = "<!-- surface-table:begin -->", "<!-- surface-table:end -->"
# the gate's feature table (jobs/features.markdown), written by the same command
FEATURES_MARKERS = ("<!-- gate-features:begin -->", "<!-- gate-features:end -->")
# the recipe settings' injected pull requests (jobs/selftest/option_coverage.markdown), written by the same command
OPTIONS_MARKERS = ("<!-- option-prs:begin -->", "<!-- option-prs:end -->")
STATUSES = ("covered", "reason", "gap", "uncovered")
ENGINE = "engine"  # a Row's feature: the engine sets (or runs at its default) the field in every run


@dataclass(frozen=True)
class Row:
    """How one field is covered: by an engine feature (or ENGINE), or why no CPU gate check must exercise it."""

    feature: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        if bool(self.feature) == bool(self.reason):
            raise ValueError("a Row names exactly one of feature or reason")


def by(feature: str) -> Row:
    """A field exercised by an engine feature (a `features.engine_features()` name, or ENGINE)."""
    return Row(feature=feature)


def why(reason: str) -> Row:
    """A field no CPU gate check must exercise, and why."""
    return Row(reason=reason)


# Why no CPU gate check must exercise a field, grouped
NEEDS_TE = "needs Transformer Engine and CUDA"
NEEDS_CUDA = "needs CUDA (CUDA graphs)"
PRECISION_AWARE = "needs Transformer Engine: the precision-aware optimizer runs on TE's FusedAdam (0.16.1 raises)"
FSDP = "needs CUDA: Megatron-FSDP keeps its buffers and streams on the GPU"
CPU_OFFLOAD = "needs CUDA: the CPU-offload optimizer moves states between GPU and host on CUDA streams"
NCCL_ONLY = "needs NCCL: ReduceOp.AVG, which gloo refuses"
NCCL_BUFFERS = "needs CUDA and NCCL (user-buffer registration)"
EP_KERNELS = "needs CUDA: a token-dispatch backend (DeepEP, HybridEP, NCCL EP) or its tuning"
EMERGING = "needs the emerging_optimizers package (Muon, Lion, SOAP), which the engine's environment does not install"
PERF = "a performance knob: changes no tensor a checkpoint holds and nothing a load restores"
NUMERICS = ("no effect on checkpointed state or on what a load restores: it changes the step's arithmetic alike in "
            "both runs and keeps nothing across steps")
RNG_ONLY = ("no state of its own: it draws from the generators rng_state restores (checked through "
            "megatron:hidden_dropout)")
LOGGING = "logging only: no effect on training or on the checkpoint"
DEPRECATED = "deprecated: this build ignores it"
REFUSED = "deprecated: this build refuses it (ValueError naming its replacement)"
DERIVED = "derived by Megatron-Core from the pipeline layout, not a user's setting"
HOOK = "a loss-scaling callable the training loop installs at run time, not a setting (the fp16 scaler: megatron:fp16)"
NO_READER = "no optimizer code reads it (0.16.1, main): TransformerConfig's params_dtype decides the params' dtype"
PP_SPLIT = ("no effect on what a load restores: it moves layers between pipeline stages, and the checkpoint's keys "
            "carry global layer numbers from the same offset rule at save and load (the pipeline: parallel:pp)")
GROUPED_TENSOR = "needs Transformer Engine: TE's GroupedTensor holds the experts' weights (another layout, GPU only)"

# One table per section; a field that is a known gap is listed in KNOWN_GAPS instead, never here.
# TransformerConfig (with ModelParallelConfig) fields jobs/rank/surface.py keeps (MoE, MTP, embeddings, precision,
# parallel layout)
_TRANSFORMER: dict[str, Row] = {
    # several model chunks per stage (interleaved 1F1B), saved as model0, model1 (gpt-recipe at PP 2)
    "virtual_pipeline_model_parallel_size": by("megatron:virtual_pipeline_model_parallel_size"),
    # finalize_model_grads divides the grads by the step's all-reduced token count (the recipe configs)
    "calculate_per_token_loss": by("megatron:calculate_per_token_loss"),
    "tensor_model_parallel_size": by("parallel:tp"),
    "sequence_parallel": by("parallel:tp"),  # the engine turns it on with TP > 1 (MoE refuses TP without it)
    "pipeline_model_parallel_size": by("parallel:pp"),
    "pipeline_dtype": by("parallel:pp"),  # the engine sets it with PP > 1
    "expert_model_parallel_size": by("parallel:ep"),
    "context_parallel_size": why("needs Transformer Engine: the local DotProductAttention asserts "
                                 "context_parallel_size == 1 ('only supported by TEDotProductAttention')"),
    "expert_gtp_weight_remat_size": why("derived from expert_tensor_parallel_num_weight_shards (internal, no "
                                        "flag), not a user's setting"),
    "moe_extended_tp": why(DEPRECATED),
    "fp16": by("megatron:fp16"),
    "bf16": by("megatron:bf16"),
    "params_dtype": by(ENGINE),
    "autocast_dtype": why("only read for torch.autocast('cuda', ...) in the pipeline schedules: needs CUDA"),
    "fp32_residual_connection": why(NUMERICS),
    "gated_linear_unit": by("megatron:gated_linear_unit"),
    "activation_func": by("megatron:activation_func"),  # silu with the gated MLP, gelu elsewhere
    "normalization": by(ENGINE),  # LayerNorm in every run
    "num_moe_experts": by("megatron:num_moe_experts"),
    "moe_ffn_hidden_size": by("megatron:num_moe_experts"),  # the engine sets it in every MoE config
    "moe_router_topk": by("megatron:moe_router_topk"),
    "moe_router_score_function": by("megatron:moe_router_score_function"),
    "moe_router_dtype": by("megatron:moe_router_dtype"),
    "moe_router_load_balancing_type": by("megatron:moe_router_load_balancing_type"),
    "moe_aux_loss_coeff": by("megatron:moe_router_load_balancing_type"),  # 1e-2 with aux_loss, 0 with none
    "moe_router_enable_expert_bias": by("megatron:moe_router_enable_expert_bias"),
    "moe_router_bias_update_rate": by("megatron:moe_router_bias_update_rate"),
    "moe_token_dispatcher_type": by("megatron:moe_token_dispatcher_type"),
    "moe_shared_expert_intermediate_size": by("megatron:moe_shared_expert_intermediate_size"),
    "moe_grouped_gemm": by("megatron:moe_grouped_gemm"),
    "moe_router_pre_softmax": why(NUMERICS),
    "moe_router_topk_scaling_factor": why(NUMERICS),
    "moe_router_num_groups": why(NUMERICS),
    "moe_router_group_topk": why(NUMERICS),
    "moe_router_topk_limited_devices": why(REFUSED),
    "moe_z_loss_coeff": why(NUMERICS),
    "moe_input_jitter_eps": why(RNG_ONLY),
    "moe_expert_capacity_factor": why(NUMERICS),  # token dropping: which tokens reach an expert this step
    "moe_pad_expert_input_to_capacity": why(NUMERICS),
    "moe_token_drop_policy": why(NUMERICS),
    "moe_apply_probs_on_input": why(NUMERICS),
    "moe_token_dropping": why("unsupported upstream: the field's own documentation says it must remain False"),
    "moe_enable_routing_replay": why("records and replays routing decisions inside one step (recompute, RL "
                                     "rollouts); nothing is kept across steps or saved"),
    "moe_router_force_load_balancing": why("benchmark-only: replaces the router's logits with random ones; not a "
                                           "training setting"),
    "moe_router_force_biased": why("experimental benchmark routing: a random bias from a seed shared by all "
                                   "ranks, recomputed from that seed; no state a checkpoint holds"),
    "moe_per_layer_logging": why(LOGGING),
    "moe_layer_recompute": why(PERF),
    "moe_shared_expert_overlap": why(PERF),
    "overlap_moe_expert_parallel_comm": why(PERF),
    "overlap_dispatch_backward_with_experts_wgrad": why(NEEDS_TE),
    "moe_paged_stash": why(PERF),
    "moe_paged_stash_page_size": why(PERF),
    "moe_paged_stash_buffer_size_factor_cuda": why(PERF),
    "moe_paged_stash_buffer_size_factor_cpu": why(PERF),
    "moe_pad_experts_for_cuda_graph_inference": why("inference only (CUDA-graph decode): no effect on training"),
    "moe_use_legacy_grouped_gemm": why("the legacy GroupedMLP runs the grouped_gemm package's CUDA kernels: "
                                       "needs CUDA"),
    "moe_use_grouped_tensor": why(NEEDS_TE),
    "moe_single_grouped_weight": why(GROUPED_TENSOR),
    "moe_single_grouped_bias": why(GROUPED_TENSOR),
    "moe_mlp_glu_interleave_size": why(NEEDS_TE),
    "moe_shared_expert_glu_interleave_size": why(NEEDS_TE),
    "use_grouped_gemm_for_shared_expert": why(NEEDS_TE),
    "moe_permute_fusion": why(NEEDS_TE),
    "moe_router_fusion": why(NEEDS_TE),
    "moe_router_padding_for_quantization": why(NEEDS_TE),
    "moe_router_padding_for_fp8": why(NEEDS_TE),
    "moe_enable_deepep": why(EP_KERNELS),
    "moe_flex_dispatcher_backend": why(EP_KERNELS),
    "moe_flex_dispatcher_num_sms": why(EP_KERNELS),
    "moe_deepep_num_sms": why(EP_KERNELS),
    "moe_hybridep_num_sms": why(EP_KERNELS),
    "moe_hybridep_num_sms_preprocessing": why(EP_KERNELS),
    "moe_hybridep_num_blocks_permute": why(EP_KERNELS),
    "moe_hybridep_num_blocks_unpermute": why(EP_KERNELS),
    "moe_hybridep_pad_uneven_dispatch_inputs": why(EP_KERNELS),
    "moe_permute_fusion_into_hybridep": why(EP_KERNELS),
    "moe_ncclep_zero_copy": why(EP_KERNELS),
    "moe_dispatch_fwd_dtype": why(EP_KERNELS),
    "moe_combine_bwd_dtype": why(EP_KERNELS),
    "moe_expert_rank_capacity_factor": why(EP_KERNELS),
    "moe_grad_scale_func": why(HOOK),
    "mtp_num_layers": by("megatron:mtp_num_layers"),
    "mtp_loss_scaling_factor": by("megatron:mtp_loss_scaling_factor"),
    "mtp_standalone": why(DERIVED),
    "mtp_detach_heads": why(NUMERICS),  # only where the MTP loss's grads flow
    "mtp_hsm": why(RNG_ONLY),
    "mtp_grad_scale_func": why(HOOK),
    "mtp_hybrid_override_pattern": why("deprecated, for loading old hybrid (Mamba) checkpoints: the engine trains "
                                       "GPT models"),
    "account_for_embedding_in_pipeline_split": why(PP_SPLIT),
    "defer_embedding_wgrad_compute": why(PERF),
    "clone_scatter_output_in_embedding": why(PERF),
    "mup_embedding_mult": why(NUMERICS),
    "fp8": by("megatron:fp8"),
    "fp8_recipe": by("megatron:fp8_recipe"),
    "fp8_interval": why(DEPRECATED),
    "fp4": why(NEEDS_TE),
    "fp4_recipe": why(NEEDS_TE),
    "fp4_param": why(NEEDS_TE),
    "fp4_quantizer_factory": why(NEEDS_TE),
}
# every other fp8_* field: Transformer Engine's FP8 (the fp8 configs are GPU checks)
_TRANSFORMER.update({name: why(NEEDS_TE) for name in (
    "fp8_param", "fp8_quantizer_factory", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
    "fp8_wgrad", "fp8_dot_product_attention", "fp8_multi_head_attention", "fp8_output_proj",
)})

_DDP: dict[str, Row] = {
    # each bucket's grad norm validated through the rerun state machine before its reduction (the recipes)
    "check_for_nan_in_grad": by("megatron:check_for_nan_in_grad"),
    "use_distributed_optimizer": by("optimizer:distributed-adam"),
    "grad_reduce_in_fp32": by("megatron:grad_reduce_in_fp32"),  # FP32 in every run but gpt-recipe's bf16
    "overlap_grad_reduce": by("megatron:overlap_grad_reduce"),
    "overlap_param_gather": by("megatron:overlap_param_gather"),
    "bucket_size": by("megatron:bucket_size"),
    "align_param_gather": why(PERF),
    "reduce_scatter_with_fp32_accumulation": why(NUMERICS),
    "average_in_collective": why(NCCL_ONLY),
    "fp8_param_gather": why(NEEDS_TE),
    "fp4_param_gather": why(NEEDS_TE),
    "reuse_grad_buf_for_mxfp8_param_ag": why(NEEDS_TE),
    "delay_wgrad_compute": why(NEEDS_TE),  # TE's layers only (RuntimeError below TE 2.3)
    "nccl_ub": why(NCCL_BUFFERS),
    "disable_symmetric_registration": why(NCCL_BUFFERS),
}
# Megatron-FSDP's switches and knobs
_DDP.update({name: why(FSDP) for name in (
    "use_megatron_fsdp", "use_custom_fsdp", "data_parallel_sharding_strategy", "outer_dp_sharding_strategy",
    "gradient_reduce_div_fusion", "suggested_communication_unit_size", "preserve_fp32_weights",
    "keep_fp8_transpose_cache", "fsdp_double_buffer", "fsdp_manual_registration", "fsdp_all_gather_in_start_param_sync",
    "fsdp_db_use_persist_buf_on_alloc_fail", "megatron_fsdp_version", "megatron_fsdp_main_params_dtype",
    "megatron_fsdp_main_grads_dtype", "megatron_fsdp_grad_comm_dtype", "megatron_fsdp_use_decoupled_grad",
    "megatron_fsdp_cuda_graph_mode", "megatron_fsdp_enable_fine_grained_param_gather",
    "megatron_fsdp_max_pool_double_buffer",
)})

_OPTIMIZER: dict[str, Row] = {
    # jobs/rank/model.py sets these (or runs Adam at their defaults) in every run
    **{name: by(ENGINE) for name in ("optimizer", "lr", "min_lr", "weight_decay", "clip_grad", "adam_beta1",
                                     "adam_beta2", "adam_eps", "decoupled_weight_decay")},
    "use_distributed_optimizer": by("optimizer:distributed-adam"),
    "use_layer_wise_distributed_optimizer": by("optimizer:layerwise-adam"),
    "bf16": by("megatron:bf16"),
    "fp16": by("megatron:fp16"),
    "loss_scale": by("megatron:loss_scale"),
    "initial_loss_scale": by("megatron:initial_loss_scale"),
    "loss_scale_window": by("megatron:loss_scale_window"),
    "hysteresis": by("megatron:hysteresis"),
    "min_loss_scale": by("megatron:fp16"),  # the engine's fp16 configs set it with the dynamic scaler
    "decoupled_lr": by("megatron:decoupled_lr"),
    "decoupled_min_lr": by("megatron:decoupled_min_lr"),
    "params_dtype": why(NO_READER),
    "fp8_recipe": why(NEEDS_TE),
    "reuse_grad_buf_for_mxfp8_param_ag": why(NEEDS_TE),
    "overlap_param_gather_with_optimizer_step": why(PERF),
    "grad_norm_skip_threshold": why("no effect on checkpointed state: it skips the update of a step whose grad "
                                    "norm exceeds it, decided from that step's grads alone"),
    "optimizer_cuda_graph": why(NEEDS_CUDA),
    **{name: why(PRECISION_AWARE) for name in ("use_precision_aware_optimizer", "store_param_remainders",
                                               "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                                               "exp_avg_sq_dtype")},
    **{name: why(CPU_OFFLOAD) for name in ("optimizer_cpu_offload", "optimizer_offload_fraction",
                                           "use_torch_optimizer_for_cpu_offload", "overlap_cpu_optimizer_d2h_h2d",
                                           "pin_cpu_grads", "pin_cpu_params")},
    **{name: why(LOGGING) for name in ("log_num_zeros_in_grad", "barrier_with_L1_time", "timers",
                                       "config_logger_dir")},
    **{name: why(EMERGING) for name in (
        "muon_momentum", "muon_split_qkv", "muon_use_nesterov", "muon_nesterov", "muon_scale_mode",
        "muon_fp32_matmul_prec", "muon_num_ns_steps", "muon_tp_mode", "muon_extra_scale_factor",
        "muon_coefficient_type", "muon_use_syrk", "muon_scalar_optimizer", "lion_beta1", "lion_beta2",
        "soap_shampoo_beta", "soap_use_kl_shampoo", "adaptive_muon_moment2_method", "adaptive_muon_beta2",
        "adaptive_muon_eps",
    )},
}

_SCHEDULER: dict[str, Row] = {
    # jobs/rank/model.py passes each of these to OptimizerParamScheduler in every run
    **{name: by(ENGINE) for name in ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
                                     "start_wd", "end_wd", "wd_incr_steps", "wd_incr_style")},
    "init_lr": by("megatron:lr_warmup_init"),
    "override_opt_param_scheduler": by("megatron:override_opt_param_scheduler"),
    # the engine turns it off with override_opt_param_scheduler, as Megatron-Bridge does
    "use_checkpoint_opt_param_scheduler": by("megatron:override_opt_param_scheduler"),
    "wsd_decay_steps": by("megatron:wsd_decay_steps"),
    "lr_wsd_decay_style": by("megatron:lr_wsd_decay_style"),
}

_TRAINING_STATE: dict[str, Row] = {
    "iteration": by(ENGINE),  # saved and restored by every run (jobs/rank/checkpoint.py)
    "opt_param_scheduler": by(ENGINE),
    "rng_state": by("megatron:hidden_dropout"),  # only dropout draws from it: the dropout check shows a lost RNG
    "num_floating_point_operations_so_far": why("a throughput counter the training loop reports; no model, "
                                                "optimizer or scheduler value depends on it"),
    # saved with the checkpoint and restored by the load; its mode and state compared (jobs/rank/rerun.py)
    "rerun_state_machine": by("megatron:rerun_mode"),
    "checkpoint_version": why("a format tag load_checkpoint reads to convert checkpoints of older Megatron-LM "
                              "releases; a checkpoint saved and loaded by the same build converts nothing"),
}

_SECTIONS = {"ddp": _DDP, "optimizer": _OPTIMIZER, "scheduler": _SCHEDULER, "transformer": _TRANSFORMER,
             "training_state": _TRAINING_STATE}
CLASSIFIED: dict[str, Row] = {
    f"{section}.{name}": row for section, table in _SECTIONS.items() for name, row in table.items()
}

_NOT_YET = " (not exercised yet)"
_RERUN = ("large-grad detection keeps per-context maximum values in the rerun state machine, which Megatron-LM "
          "does not checkpoint (validation counts reset on resume); the recipes run the machine with the NaN/Inf check "
          "only")
# Fields that change what a checkpoint holds or how a load restores it and that no engine feature exercises yet:
# each says what a resume could get wrong. Closing one moves it to a section table above with its feature.
KNOWN_GAPS: dict[str, str] = {
    "ddp.num_buckets": "main: the bucket boundaries from a count instead of bucket_size; the per-bucket save and "
    "load is exercised through megatron:bucket_size, this way to the boundaries is not" + _NOT_YET,
    "ddp.pad_buckets_for_high_nccl_busbw": "buckets padded to 2^16 elements move the shard boundaries the "
    "DistributedOptimizer saves and loads by (unpadded buckets: megatron:bucket_size)" + _NOT_YET,
    "ddp.num_distributed_optimizer_instances": "partial distributed optimizer: shards replicated across instances, "
    "another shard-to-rank map and other replica ids in the checkpoint" + _NOT_YET,
    "ddp.check_for_large_grads": _RERUN + _NOT_YET,
    "ddp.param_name_patterns_for_fp32_local_accumulation": "main: matched params get FP32 grad buffers of their own, "
    "changing the buffers' dtype grouping and the DistributedOptimizer's shards" + _NOT_YET,
    "optimizer.apply_wd_to_qk_layernorm": "qk-layernorm params in the weight-decay group change the groups the "
    "optimizer state is saved by; the engine's models have no qk layernorm" + _NOT_YET,
    "optimizer.overlap_param_gather": "main: the layer-wise optimizer defers its own param all-gather to the next "
    "forward, so after a load its params must be gathered before the first step (0.16.1 reads it nowhere; DDP's "
    "deferred gather is megatron:overlap_param_gather)" + _NOT_YET,
    "optimizer.sgd_momentum": "optimizer 'sgd': the momentum buffers are the state a load must restore instead of "
    "Adam's moments; the engine trains Adam only" + _NOT_YET,
    "transformer.expert_tensor_parallel_size": "the experts' own TP size: another sharding of the expert weights "
    "and their optimizer state; no gate check runs MoE at TP > 1" + _NOT_YET,
    "transformer.expert_tensor_parallel_num_weight_shards": "main: how many shards each expert weight is split "
    "into, another sharded layout of the expert weights" + _NOT_YET,
    "transformer.moe_layer_freq": "dense MLP layers beside MoE layers in one model and optimizer chain; the "
    "engine's MoE configs make every layer MoE" + _NOT_YET,
    "transformer.moe_shared_expert_gate": "a learned gate param on the shared expert" + _NOT_YET,
    "transformer.moe_latent_size": "latent projection params around the routed experts" + _NOT_YET,
    "transformer.moe_router_quantile_balancing_ema": "main: quantile balancing keeps a persistent per-expert bias "
    "(qb_beta) updated every global batch, which a load must restore" + _NOT_YET,
    "transformer.mtp_use_repeated_layer": "main: one MTP layer reused at every depth, so the MTP head's params "
    "and their optimizer state change shape" + _NOT_YET,
    "training_state.consumed_train_samples": "the data sampler's position; the engine's batches are keyed by "
    "step, and its sample-counting scheduler (megatron:scheduler_by_samples) keeps its own count" + _NOT_YET,
}
# The engine feature expected to close a gap, where it is not megatron:<field> (None: no feature name to watch)
CLOSED_BY: dict[str, str | None] = {
    # megatron:overlap_param_gather is DDP's deferred gather; the layer-wise optimizer's has no feature yet
    "optimizer.overlap_param_gather": None,
}


def closing_feature(key: str) -> str | None:
    """The engine feature that will close a known gap (`megatron:<field>` unless CLOSED_BY says otherwise)."""
    return CLOSED_BY.get(key, f"megatron:{key.split('.', 1)[1]}")


def gate_specs(path: Path = GATE) -> dict[str, RunSpec]:
    """The checks of a suite file (suites/gate.yaml by default): {name: RunSpec}."""
    import yaml  # a base dependency (the client reads suites with it); imported here, the table needs none

    checks = yaml.safe_load(path.read_text())["checks"]
    return {c["name"]: RunSpec.from_dict(c["spec"]) for c in checks}


def _row(section: str, name: str, status: str, checks: list[str], detail: str) -> dict[str, Any]:
    return {"section": section, "field": name, "status": status, "checks": checks, "detail": detail}


def _classify_field(section: str, name: str, table: dict[str, Any], all_checks: list[str]) -> dict[str, Any]:
    key = f"{section}.{name}"
    if key in KNOWN_GAPS:
        return _row(section, name, "gap", [], KNOWN_GAPS[key])
    row = CLASSIFIED.get(key)
    if row is None:
        return _row(section, name, "uncovered", [], "not in jobs/surface_table.py: classify it")
    if row.reason:
        return _row(section, name, "reason", [], row.reason)
    if row.feature == ENGINE:
        return _row(section, name, "covered" if all_checks else "uncovered", all_checks, ENGINE)
    feature = table.get(row.feature)
    if feature is None:
        return _row(section, name, "uncovered", [], f"{row.feature}: not a feature the engine knows")
    if feature["checks"]:
        return _row(section, name, "covered", feature["checks"], row.feature)
    if feature["reason"]:  # a feature the engine itself says no CPU check can run (a GPU config's)
        return _row(section, name, "reason", [], f"{row.feature}: {feature['reason']}")
    return _row(section, name, "uncovered", [], f"{row.feature}: no gate check exercises it")


def classify(surface: dict[str, list[str]], gate_specs: dict[str, RunSpec]) -> list[dict[str, Any]]:
    """One row per field of the surface: section, field, status (STATUSES), checks, detail (feature or reason)."""
    table = features.coverage(gate_specs)
    all_checks = sorted(gate_specs)
    return [_classify_field(section, name, table, all_checks) for section, names in surface.items() for name in names]


def stale(surface: dict[str, list[str]]) -> list[str]:
    """The classified or gap keys the surface lacks (older builds lack newer fields): prune when no build has them."""
    present = {f"{section}.{name}" for section, names in surface.items() for name in names}
    return sorted((set(CLASSIFIED) | set(KNOWN_GAPS)) - present)


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many rows have each status."""
    return {status: sum(r["status"] == status for r in rows) for status in STATUSES}


def _cell(row: dict[str, Any]) -> str:
    if row["status"] != "covered":
        return row["detail"]
    if row["detail"] == ENGINE:
        return f"set by the engine in every run (all {len(row['checks'])} checks)"
    # a feature many checks exercise reads as a count: the full list is in the gate's feature table
    shown = ", ".join(f"`{c}`" for c in row["checks"]) if len(row["checks"]) <= 3 else f"{len(row['checks'])} checks"
    return f"`{row['detail']}`: {shown}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table: section | field | status | checks or reason."""
    lines = ["| section | field | status | checks or reason |", "|---|---|---|---|"]
    for row in rows:
        section, name, cell = (text.replace("|", "\\|") for text in (row["section"], row["field"], _cell(row)))
        lines.append(f"| {section} | `{name}` | {row['status']} | {cell} |")
    return "\n".join(lines) + "\n"


def read_surface_of(python: str) -> dict[str, list[str]]:
    """The surface of the build another Python has installed (`python -m jobs.rank.surface`, run here)."""
    out = subprocess.run([python, "-m", "jobs.rank.surface"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:  # e.g. no Megatron-Core in that environment: say so, with the end of its traceback
        raise RuntimeError(f"{python} -m jobs.rank.surface failed ({out.returncode}): {out.stderr[-2000:]}")
    surface: dict[str, list[str]] = json.loads(out.stdout)
    return surface


def replace_table(document: str, table: str, markers: tuple[str, str] = (BEGIN, END)) -> str:
    """The document with the text between the markers (the surface table's by default) replaced by `table`."""
    begin, end = markers
    head, sep, rest = document.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not (sep and sep2):
        raise ValueError(f"the document has no {begin} ... {end} markers")
    return f"{head}{begin}\n{table}{end}{tail}"


def table_in(document: str, markers: tuple[str, str] = (BEGIN, END)) -> str:
    """The text between the markers (what replace_table writes)."""
    return document.partition(markers[0])[2].partition(markers[1])[0].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    """Print (or write into a document) the coverage table of a build's surface against a suite."""
    parser = argparse.ArgumentParser(prog="python -m jobs.surface_table", description=main.__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--surface", type=Path, help="a JSON file `python -m jobs.rank.surface` printed")
    source.add_argument("--python", default=sys.executable, help="the Python whose build to read (default: this one)")
    parser.add_argument("--suite", type=Path, default=GATE, help="the suite file (default: suites/gate.yaml)")
    parser.add_argument("--write", type=Path, help=f"replace the table between the markers in this file ({DOC.name})")
    args = parser.parse_args(argv)
    surface = json.loads(args.surface.read_text()) if args.surface else read_surface_of(args.python)
    rows = classify(surface, gate_specs(args.suite))
    table = markdown(rows)
    if args.write:
        document = replace_table(args.write.read_text(), table)
        document = replace_table(document, features.markdown(gate_specs(args.suite)), FEATURES_MARKERS)
        args.write.write_text(replace_table(document, option_coverage.markdown(), OPTIONS_MARKERS))
    else:
        sys.stdout.write(table)
    print(f"{counts(rows)}; classified but absent from this build: {', '.join(stale(surface)) or 'none'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
