"""Named, validated model configurations that a parity run can train.

Every config is small enough to train on two CPU cores in about a second per phase, and each one
exists to put the optimizer into a specific shape (see `why`). Nothing here imports torch, so the
service can list configs without paying for Megatron-Core.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

MODEL_KINDS = ("gpt", "linear-stack")
ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid")
ROUTER_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "none")
OPTIMIZER_KINDS = ("distributed-adam", "layerwise-adam")
MAX_MTP_LAYERS = 2
FP8_FORMATS = ("", "hybrid", "e4m3")  # "": no FP8; TransformerConfig.fp8 otherwise (Transformer Engine only)
LR_DECAY_STYLES = ("cosine", "linear", "constant", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
MAX_MICROBATCHES = 4
# How the engine trains a config: 1, the toy way (one bucket, one microbatch, untied, equal groups, a bare
# scheduler); 2, the production recipe by default. Part of every check's identity (jobs/spec.py).
TRAINING_REVISION = 2


@dataclass(frozen=True)
class ModelConfig:
    """One named model + optimizer shape; validated on creation."""

    name: str
    description: str
    why: str
    kind: str = "gpt"
    num_layers: int = 2
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_experts: int = 0  # 0: dense MLP
    moe_router_topk: int = 2
    ffn_hidden_size: int = 0  # 0: 2 x hidden_size (MLP and experts)
    dropout: float = 0.0  # hidden and attention dropout (> 0 makes the RNG restore matter)
    vocab_size: int = 1024
    seq_length: int = 32
    micro_batch_size: int = 2  # samples per microbatch (x microbatches per rank and step)
    # Module-name suffixes re-cast to FP32 after Float16Module (the "keep in FP32" recipe).
    fp32_modules: tuple[str, ...] = ()
    # Learnable FP32 scalar gate on every MLP output (numel 1: exercises 64-alignment padding).
    fp32_residual_gates: bool = False
    # linear-stack only: widths of the bf16 layers and of the FP32 head layers.
    bf16_layers: int = 4
    fp32_head_layers: int = 0
    readout: bool = False  # linear-stack only: add a 1-D input scale and a 1 x width readout
    optimizer: str = "distributed-adam"
    lr: float = 1e-3
    min_lr: float = 1e-4
    # the gate saves at step 2 of 5: inside the warmup, with its last step and two decay steps after it
    lr_warmup_steps: int = 3
    lr_decay_style: str = "cosine"
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    max_dp: int = 8
    # Production MoE / precision features (each switches on Megatron settings, see `megatron_settings`)
    router_score_function: str = "softmax"  # "sigmoid" for aux-loss-free routing
    router_load_balancing: str = "aux_loss"  # "none": no aux loss (the expert bias balances instead)
    expert_bias: bool = False  # moe_router_enable_expert_bias: a persistent per-expert buffer updated each step
    shared_expert_size: int = 0  # moe_shared_expert_intermediate_size (0: none)
    fp16: bool = False  # fp16 params + the dynamic loss scaler (instead of bf16)
    initial_loss_scale: float = 2.0**16  # fp16 only: where the dynamic scaler starts
    loss_scale_window: int = 2  # fp16 only: steps without overflow before the scale doubles
    grouped_gemm: bool = False  # moe_grouped_gemm with Transformer Engine's layer spec (GPU only)
    fp8: str = ""  # TransformerConfig.fp8 with Transformer Engine's layer spec (GPU only)
    # Multi-token prediction (DeepSeek-V3 style): mtp_num_layers extra depths after the decoder, each an
    # embedding/hidden norm pair, an eh_proj and one transformer layer; their loss scaled by
    # mtp_loss_scaling_factor / mtp_num_layers joins the main loss's backward (MTPLossAutoScaler)
    mtp_num_layers: int = 0
    mtp_loss_scaling_factor: float = 0.1
    # How production recipes train (Megatron-LM's examples, Megatron-Bridge's recipes; ../docs/detection.md).
    # Every default is what those recipes turn on, so every config trains the production way unless its
    # shape cannot (a linear stack has no MLP or embedding: it says so). The engine trained the toy way
    # before TRAINING_REVISION 2; a check's identity carries the revision and these fields
    # (jobs/spec.py training_fingerprint), so no history compares a recipe-shaped run with a toy one.
    gated_mlp: bool = True  # SwiGLU: gated_linear_unit with silu; fc1 holds two matrices
    tied_embeddings: bool = True  # share_embeddings_and_output_weights (the last PP stage holds a copy)
    # > 0: overlap_grad_reduce + overlap_param_gather with buckets of this many elements (several
    # buckets per buffer, the param all-gather deferred to the next forward); 0: one bucket, no overlap
    bucket_size: int = 20_000
    # per DP rank and step, through Megatron's schedule (no_sync before the last); with micro_batch_size
    # 2 a rank's step holds the 4 samples the toy engine drew at once
    microbatches: int = 2
    grad_reduce_in_fp32: bool = True  # False: grads reduced in the params' bf16 (an option, in the gate)
    # > 0: the embedding and output layer's own max_lr (decoupled_lr): their param groups differ from
    # the others in their LR bounds only
    decoupled_lr: float = 2e-3
    decoupled_min_lr: float = 2e-4  # with decoupled_lr: their own min_lr
    lr_warmup_init: float = 1e-4  # warmup starts here, not at 0
    wsd_decay_steps: int = 0  # lr_decay_style "WSD": the annealing steps at the end
    lr_wsd_decay_style: str = "linear"
    override_opt_param_scheduler: bool = False  # the scheduler keeps its own settings over the checkpoint's
    # production steps the scheduler by consumed samples, on successful updates only (warmup and decay
    # counted in samples); False: by 1 per step whatever the update did
    scheduler_by_samples: bool = True
    per_token_loss: bool = False  # calculate_per_token_loss: grads divided by the step's token count
    # > 0: the embedding and output layer hold vocab_size padded up to a multiple of this x tp
    # (Megatron-LM's make_vocab_size_divisible_by); the data draws tokens below vocab_size only
    vocab_padding_multiple: int = 0
    # the metadata Megatron-LM's trainer gives sharded_state_dict (chained_optim_avoid_prefix, no singleton
    # local shards, the DP group): the checkpoint's key layout production writes
    checkpoint_metadata: bool = True
    # Megatron's rerun state machine as production runs it: check_for_nan_in_grad validating each bucket's
    # grads through it, every step inside should_run_forward_backward (--rerun-mode validate_results), its
    # state saved with the checkpoint and restored by the load (jobs/rank/rerun.py)
    rerun_state_machine: bool = False
    # > 1: at PP > 1 each stage holds this many model chunks (virtual pipeline, interleaved 1F1B), each
    # its own DDP and checkpointed as model0, model1, ...; num_layers must divide by pp x chunks
    virtual_pipeline: int = 1
    # What the feature needs beyond CPU Megatron-Core ("cuda", "transformer-engine"): a GPU check
    requires: tuple[str, ...] = ()
    expected: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} not in {MODEL_KINDS}")
        if self.optimizer not in OPTIMIZER_KINDS:
            raise ValueError(f"{self.name}: optimizer {self.optimizer!r} not in {OPTIMIZER_KINDS}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{self.name}: hidden_size must be divisible by num_attention_heads")
        if self.num_experts and self.moe_router_topk > self.num_experts:
            raise ValueError(f"{self.name}: moe_router_topk exceeds num_experts")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{self.name}: dropout must be in [0, 1)")
        if not 1 <= self.max_dp <= 8:
            raise ValueError(f"{self.name}: max_dp must be in 1..8")
        if self.router_score_function not in ROUTER_SCORE_FUNCTIONS:
            raise ValueError(f"{self.name}: router_score_function not in {ROUTER_SCORE_FUNCTIONS}")
        if self.router_load_balancing not in ROUTER_LOAD_BALANCING:
            raise ValueError(f"{self.name}: router_load_balancing not in {ROUTER_LOAD_BALANCING}")
        if self.expert_bias and self.router_score_function != "sigmoid":
            raise ValueError(f"{self.name}: expert_bias needs sigmoid router scores (Megatron refuses softmax)")
        if (self.expert_bias or self.shared_expert_size) and not self.num_experts:
            raise ValueError(f"{self.name}: expert_bias / shared experts need an MoE config")
        if self.grouped_gemm and not {"cuda", "transformer-engine"} <= set(self.requires):
            raise ValueError(f"{self.name}: grouped_gemm needs requires=('cuda', 'transformer-engine')")
        if self.fp16 and self.kind != "gpt":
            raise ValueError(f"{self.name}: fp16 is built for GPT configs only")
        if self.fp8 not in FP8_FORMATS:
            raise ValueError(f"{self.name}: fp8 {self.fp8!r} not in {FP8_FORMATS}")
        if self.fp8 and not {"cuda", "transformer-engine"} <= set(self.requires):
            raise ValueError(f"{self.name}: fp8 needs requires=('cuda', 'transformer-engine')")
        if not 0 <= self.mtp_num_layers <= MAX_MTP_LAYERS:
            raise ValueError(f"{self.name}: mtp_num_layers must be in 0..{MAX_MTP_LAYERS}")
        if self.mtp_num_layers and self.kind != "gpt":
            raise ValueError(f"{self.name}: mtp_num_layers needs a GPT config")
        if "eh_proj" in self.fp32_modules and not self.mtp_num_layers:
            raise ValueError(f"{self.name}: an FP32 eh_proj needs an MTP head (mtp_num_layers > 0)")
        if not 0.0 < self.mtp_loss_scaling_factor <= 1.0:
            raise ValueError(f"{self.name}: mtp_loss_scaling_factor must be in (0, 1]")
        self._check_recipe()

    def _check_recipe(self) -> None:
        if self.lr_decay_style not in LR_DECAY_STYLES:
            raise ValueError(f"{self.name}: lr_decay_style {self.lr_decay_style!r} not in {LR_DECAY_STYLES}")
        if (self.lr_decay_style == "WSD") != (self.wsd_decay_steps > 0):
            raise ValueError(f"{self.name}: lr_decay_style WSD and wsd_decay_steps > 0 go together")
        if self.lr_wsd_decay_style not in WSD_DECAY_STYLES:
            raise ValueError(f"{self.name}: lr_wsd_decay_style not in {WSD_DECAY_STYLES}")
        if not 1 <= self.microbatches <= MAX_MICROBATCHES:
            raise ValueError(f"{self.name}: microbatches must be in 1..{MAX_MICROBATCHES}")
        if self.bucket_size < 0 or (self.bucket_size and self.optimizer != "distributed-adam"):
            raise ValueError(f"{self.name}: bucket_size needs the distributed optimizer and must be >= 0")
        if (self.gated_mlp or self.tied_embeddings) and self.kind != "gpt":
            raise ValueError(f"{self.name}: gated_mlp / tied_embeddings need a GPT config")
        if self.vocab_padding_multiple < 0 or (self.vocab_padding_multiple and self.kind != "gpt"):
            raise ValueError(f"{self.name}: vocab_padding_multiple needs a GPT config and must be >= 0")
        if not 1 <= self.virtual_pipeline <= 2 or (self.virtual_pipeline > 1 and not self.recipe_loop):
            raise ValueError(f"{self.name}: virtual_pipeline must be 1 or 2, and 2 only with Megatron's schedule")
        if self.decoupled_min_lr and not self.decoupled_lr:
            raise ValueError(f"{self.name}: decoupled_min_lr needs decoupled_lr")
        if not 0.0 <= self.lr_warmup_init <= self.lr:
            raise ValueError(f"{self.name}: lr_warmup_init must be in [0, lr]")

    @property
    def recipe_loop(self) -> bool:
        """Whether a step runs through Megatron's own schedule, as a production trainer's does."""
        return self.microbatches > 1 or self.bucket_size > 0 or self.scheduler_by_samples or self.per_token_loss

    def padded_vocab_size(self, tp: int = 1) -> int:
        """The vocabulary the embedding holds: vocab_size, or padded as Megatron-LM pads it for `tp` ranks."""
        if not self.vocab_padding_multiple:
            return self.vocab_size
        multiple = self.vocab_padding_multiple * tp
        return -(-self.vocab_size // multiple) * multiple

    @property
    def parameters(self) -> dict[str, Any]:
        """Return the shape-defining fields as plain data."""
        skip = {"name", "description", "why", "expected"}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if k not in skip}

    @property
    def training(self) -> str:
        """How this config trains, as one short name: the engine's training revision and a hash of every field.

        Part of a check's identity and of a calibrated bound's: when a config's training changes (a field, a
        default, the engine's revision) its checks start a new history and its bounds must be re-measured.
        """
        text = json.dumps(self.parameters, sort_keys=True, separators=(",", ":"))
        return f"r{TRAINING_REVISION}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    @property
    def megatron_settings(self) -> dict[str, Any]:
        """The Megatron-Core TransformerConfig / OptimizerConfig settings this config switches on."""
        out: dict[str, Any] = {"fp16": True} if self.fp16 else {"bf16": True}
        if self.dropout:  # TransformerConfig (jobs/rank/model.py sets both from the one field)
            out.update(hidden_dropout=self.dropout, attention_dropout=self.dropout)
        if self.fp16:  # OptimizerConfig: loss_scale None means the dynamic scaler
            out.update(loss_scale=None, initial_loss_scale=self.initial_loss_scale,
                       loss_scale_window=self.loss_scale_window, hysteresis=2)
        if self.num_experts:
            out.update(
                num_moe_experts=self.num_experts,
                moe_router_topk=self.moe_router_topk,
                moe_router_score_function=self.router_score_function,
                moe_router_load_balancing_type=self.router_load_balancing,
                moe_router_dtype="fp32",
                moe_token_dispatcher_type="allgather",
            )
            if self.expert_bias:
                out.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3)
            if self.shared_expert_size:
                out["moe_shared_expert_intermediate_size"] = self.shared_expert_size
            if self.grouped_gemm:
                out.update(moe_grouped_gemm=True, transformer_impl="transformer_engine")
        if self.fp8:  # TE's layers run the GEMMs in FP8 (delayed scaling); TE's FusedAdam is the optimizer
            out.update(fp8=self.fp8, fp8_recipe="delayed", transformer_impl="transformer_engine")
        out.update(self._recipe_settings())
        if self.mtp_num_layers:  # GPTModel(mtp_block_spec=get_gpt_mtp_block_spec(...)) builds the head
            out.update(mtp_num_layers=self.mtp_num_layers, mtp_loss_scaling_factor=self.mtp_loss_scaling_factor)
            if "eh_proj" in self.fp32_modules:  # the "keep in FP32" recipe on the head's projection
                out["fp32_mtp_modules"] = ["eh_proj"]
        return out

    def _recipe_settings(self) -> dict[str, Any]:
        """The production-recipe settings this config turns on, by their Megatron-Core names."""
        out: dict[str, Any] = {}
        if self.gated_mlp:  # TransformerConfig
            out.update(gated_linear_unit=True, activation_func="silu")
        if self.tied_embeddings:  # GPTModel
            out["share_embeddings_and_output_weights"] = True
        if self.bucket_size:  # DistributedDataParallelConfig
            out.update(overlap_grad_reduce=True, overlap_param_gather=True, bucket_size=self.bucket_size)
        if not self.grad_reduce_in_fp32:
            out["grad_reduce_in_fp32"] = False
        if self.microbatches > 1:  # the schedule's num_microbatches
            out["num_microbatches"] = self.microbatches
        if self.decoupled_lr:  # OptimizerConfig
            out["decoupled_lr"] = self.decoupled_lr
            if self.decoupled_min_lr:
                out["decoupled_min_lr"] = self.decoupled_min_lr
        if self.lr_warmup_init:  # OptimizerParamScheduler
            out["lr_warmup_init"] = self.lr_warmup_init
        if self.lr_decay_style == "WSD":
            out.update(lr_decay_style="WSD", wsd_decay_steps=self.wsd_decay_steps,
                       lr_wsd_decay_style=self.lr_wsd_decay_style)
        if self.override_opt_param_scheduler:
            out["override_opt_param_scheduler"] = True
        if self.scheduler_by_samples:  # the training loop: increment = global batch samples, on success
            out["scheduler_by_samples"] = True
        if self.per_token_loss:  # TransformerConfig
            out["calculate_per_token_loss"] = True
        if self.vocab_padding_multiple:  # Megatron-LM's padding of the vocabulary
            out["make_vocab_size_divisible_by"] = self.vocab_padding_multiple
        if self.rerun_state_machine:  # DistributedDataParallelConfig + Megatron-LM's --rerun-mode
            out.update(check_for_nan_in_grad=True, rerun_mode="validate_results")
        if self.virtual_pipeline > 1:  # at PP > 1 (parallel_layout checks num_layers)
            out["virtual_pipeline_model_parallel_size"] = self.virtual_pipeline
        if self.checkpoint_metadata:  # sharded_state_dict(metadata=...)
            out.update(chained_optim_avoid_prefix=True, singleton_local_shards=False)
        return out


_MOE = dict(kind="gpt", num_layers=2, hidden_size=128, num_experts=4, moe_router_topk=2)
# The options beyond the production defaults that both recipe configs turn on alike (each keeps its own
# schedule, parallel layout and model): per-token loss, a padded vocabulary, the rerun state machine. The
# vocabulary (1100) pads to 1152 rows at TP 1 and 1280 at TP 2, as a real tokenizer's does (Llama 3's 128256 to
# 128512 at TP 4 and 129024 at TP 8): a resume on another TP size crosses a padding change, as production's do.
_RECIPE = dict(per_token_loss=True, vocab_size=1100, vocab_padding_multiple=128, rerun_state_machine=True)
# A linear stack has no MLP and no embedding: it cannot be gated or tied (it trains the rest the recipe way)
_LINEAR_STACK = dict(kind="linear-stack", gated_mlp=False, tied_embeddings=False)

CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig(
            name="moe-fp32-router",
            description="GPT, 2 MoE layers, hidden 128, 4 experts top-2, bf16, routers kept FP32 (~0.9M params)",
            why="Bug A trigger (NVIDIA/Megatron-LM#2777): the embedding's bf16 grad buffer precedes the "
            "routers' FP32 buffer, so model_param_group_index_map disagrees with the installed FP32-first "
            "order; dp_reshardable save asserts.",
            fp32_modules=("mlp.router",),
            expected={"no-workaround": "fail: optimizer-index-misalignment (save crash)"},
            **_MOE,  # type: ignore[arg-type]
        ),
        ModelConfig(
            name="moe-fp32-router-gates",
            description="moe-fp32-router plus a learnable FP32 scalar gate on each MoE layer's output",
            why="Several FP32 params (routers and 1-element gates) share a group with bf16 params, and "
            "numel-1 params make the 64-element start padding visible to the bucket-offset probe (Bug B).",
            fp32_modules=("mlp.router",),
            fp32_residual_gates=True,
            expected={"no-workaround": "fail: optimizer-index-misalignment (save crash)"},
            **_MOE,  # type: ignore[arg-type]
        ),
        ModelConfig(
            name="moe-bf16",
            description="moe-fp32-router with every param bf16 (routers not kept FP32), ~0.9M params",
            why="Bug A cannot fire without FP32 params among bf16 ones, so the index map must be exact "
            "with no workaround: the gate's direct view of a new index-map bug, which realign-param-index "
            "would otherwise share a signature with.",
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
            **_MOE,  # type: ignore[arg-type]
        ),
        ModelConfig(
            name="dense-bf16",
            description="GPT, 2 dense layers, hidden 128, all params bf16 (control)",
            why="No FP32 params, so the index map is aligned; isolates the torch-Adam `step` restore bug.",
            kind="gpt",
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
        ),
        ModelConfig(
            name="dense-bf16-dropout",
            description="dense-bf16 with hidden and attention dropout 0.1",
            why="Dropout draws from torch's generator and Megatron's RNG tracker, so a resume that does "
            "not restore RNG state draws different masks and diverges at step N+1.",
            kind="gpt",
            dropout=0.1,
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
        ),
        ModelConfig(
            name="equal-shards-fp32-head",
            description="4 bf16 64x64 linears + 2 FP32 64x64 head linears; every local shard is 4096 "
            "elements at DP 1 and 2",
            why="The silent case: the index map is misaligned but all shard sizes agree, so the save does "
            "not raise and each checkpoint slot holds another parameter's optimizer state.",
            hidden_size=64,
            num_attention_heads=4,
            bf16_layers=4,
            fp32_head_layers=2,
            fp32_modules=("head",),
            micro_batch_size=8,
            **_LINEAR_STACK,  # type: ignore[arg-type]
            max_dp=2,
            expected={"no-workaround": "fail: optimizer-index-misalignment + optimizer-state-mismatch"},
        ),
        ModelConfig(
            name="layerwise-empty-rank",
            description="4 bf16 64x64 linears + 1-D input scale + 1x64 readout, trained with "
            "LayerWiseDistributedOptimizer (torch Adam inside); at DP 2 rank 0 owns nothing in the "
            "no-weight-decay group",
            why="Bug C (fixed in core_v0.16.0): a rank owning no params of a group must not write broken "
            "common metadata; probes check the empty group and that param_groups lr/step agree across "
            "ranks after load.",
            hidden_size=64,
            bf16_layers=4,
            readout=True,
            micro_batch_size=8,
            max_dp=4,
            optimizer="layerwise-adam",
            bucket_size=0,  # the layer-wise optimizer is no DistributedOptimizer: no overlapped param gather
            **_LINEAR_STACK,  # type: ignore[arg-type]
            expected={"no-workaround": "see jobs/README.md (Bug C)"},
        ),
        ModelConfig(
            name="moe-aux-free",
            description="GPT, 2 MoE layers, 4 experts top-2, aux-loss-free routing: sigmoid scores and a "
            "per-expert bias (moe_router_enable_expert_bias) updated every step, no aux loss, bf16",
            why="DeepSeek-V3-style routing: expert_bias is a persistent buffer that "
            "finalize_model_grads moves every step from the step's token counts (the non-persistent "
            "local_tokens_per_expert), so a load that drops it routes differently from step N+1 on.",
            router_score_function="sigmoid",
            router_load_balancing="none",
            expert_bias=True,
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
            **_MOE,  # type: ignore[arg-type]
        ),
        ModelConfig(
            name="moe-shared-expert",
            description="moe-aux-free plus a shared expert (moe_shared_expert_intermediate_size 256) "
            "beside the routed ones",
            why="Shared experts are dense params inside the MoE layer (not expert-parallel): their "
            "weights and optimizer state live in the dense optimizer of the chain.",
            router_score_function="sigmoid",
            router_load_balancing="none",
            expert_bias=True,
            shared_expert_size=256,
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
            **_MOE,  # type: ignore[arg-type]
        ),
        ModelConfig(
            name="dense-fp16",
            description="GPT, 2 dense layers, hidden 128, fp16 params with Megatron's dynamic loss scaler "
            "(initial scale 2^16, doubling every 3 clean steps)",
            why="The fp16 path: the loss is scaled before backward, overflowing steps are skipped, and the "
            "scaler's scale / growth / hysteresis trackers are checkpointed state a resume must restore.",
            kind="gpt",
            fp16=True,
            # the gate saves at step 2: mid-interval (growth tracker 2 of 3), so a load that restarts or drops
            # the tracker grows the scale at another step than the uninterrupted run (at step 3)
            loss_scale_window=3,
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
        ),
        ModelConfig(
            name="gpt-mtp",
            description="GPT, 2 dense layers, hidden 128, bf16, plus a multi-token-prediction head "
            "(mtp_num_layers 1, loss scale 0.1): norms, eh_proj and one transformer layer after the decoder",
            why="DeepSeek-V3-style MTP: the head's params (module.mtp.*) train only through the MTP loss "
            "that MTPLossAutoScaler adds to the main loss's backward, so a resume that loses them or "
            "their optimizer state leaves the main loss of step N+1 untouched and shows in the state.",
            kind="gpt",
            mtp_num_layers=1,
            tied_embeddings=False,  # as DeepSeek-V3 trains it: MTP at PP > 1 then needs no unused output weight
            expected={"no-workaround": "fail: adam-step-not-restored at step N+1"},
        ),
        ModelConfig(
            name="gpt-mtp-fp32-proj",
            description="gpt-mtp with the MTP head's eh_proj kept in FP32 (its bf16 inputs cast up, its output "
            "cast back for the bf16 transformer layer)",
            why="An FP32 param in the MTP head shares the weight-decay group with bf16 ones: the FP32 buffer "
            "follows the bf16 one in DDP, so the optimizer's index map is misaligned (Bug A) and the head's "
            "projection is what a misaligned restore would swap.",
            kind="gpt",
            mtp_num_layers=1,
            fp32_modules=("eh_proj",),
            expected={"no-workaround": "fail: optimizer-index-misalignment (save crash)"},
        ),
        ModelConfig(
            name="gpt-recipe",
            description="GPT, 2 dense layers, hidden 128, bf16, trained as a production recipe: SwiGLU, tied "
            "embeddings, 2 microbatches per step, overlapped grad reduce and param gather over buckets of "
            "20,000 elements, bf16 grad reduce, a decoupled LR for the embedding, warmup from a non-zero LR, "
            "WSD decay, the scheduler stepped by samples and overriding the checkpoint's settings",
            why="What Megatron-LM's and Megatron-Bridge's Llama-style recipes turn on and a checkpoint holds: "
            "several buckets per grad buffer (their per-bucket layout and the param all-gather deferred to the "
            "next forward), the tied output weight, fc1's two matrices, param groups with their own LR bounds "
            "and a scheduler counted in samples, each of which a resume must restore as saved.",
            kind="gpt",
            num_layers=4,
            virtual_pipeline=2,  # at PP 2: two chunks of one layer per stage, interleaved 1F1B
            grad_reduce_in_fp32=False,
            # the gate saves at step 2 of 6: the resume runs the warmup's last step, a stable one and the
            # two WSD annealing steps
            lr_decay_style="WSD",
            wsd_decay_steps=2,
            lr_wsd_decay_style="cosine",
            override_opt_param_scheduler=True,
            **_RECIPE,  # type: ignore[arg-type]
            expected={"no-workaround": "fail: adam-step-not-restored + param-group-identity-collision (0.16.x)"},
        ),
        ModelConfig(
            name="moe-recipe",
            description="GPT, 2 MoE layers, 4 SwiGLU experts top-2, routers kept FP32, trained as a production MoE "
            "recipe: tied embeddings, 2 microbatches, overlapped reduce and deferred gather over buckets of 20,000 "
            "elements, per-token loss, a padded vocabulary, warmup from a non-zero LR into cosine decay, the "
            "scheduler in samples, production's checkpoint metadata",
            why="Mixtral / DeepSeek-style MoE as recipes train it: the expert params' own buffers and buckets and "
            "their own DistributedOptimizer in the chain, saved with the keys production writes "
            "(chained_optim_avoid_prefix), expert fc1s holding two matrices, and grads scaled by the step's token "
            "count; the FP32 routers keep Bug A in play.",
            fp32_modules=("mlp.router",),
            **_RECIPE,  # type: ignore[arg-type]
            expected={"no-workaround": "fail: optimizer-index-misalignment (save crash)"},
            **_MOE,  # type: ignore[arg-type]
        ),
        ModelConfig(
            name="dense-fp8-te",
            description="dense-bf16 with Transformer Engine's layer spec and FP8 GEMMs (fp8 hybrid, delayed "
            "scaling) (GPU check: needs CUDA and Transformer Engine)",
            why="FP8 training keeps per-module amax histories and scales (TE's fp8 meta, saved as _extra_state) "
            "that a resume must restore, and with TE installed get_megatron_optimizer picks TE's FusedAdam "
            "(no torch-Adam 'step' per param). On a CPU host the run is unsupported-by-build.",
            kind="gpt",
            fp8="hybrid",
            requires=("cuda", "transformer-engine"),
            expected={"cpu": "unsupported-by-build (needs CUDA and Transformer Engine)"},
        ),
        ModelConfig(
            name="moe-grouped-gemm-te",
            description="moe-aux-free with Transformer Engine's layer spec and grouped GEMM experts "
            "(GPU check: needs CUDA and Transformer Engine)",
            why="Production MoE runs keep the experts' weights as grouped-GEMM tensors (TEGroupedMLP): "
            "another sharded layout of the expert weights and their optimizer state. On a CPU host the "
            "run is unsupported-by-build, naming what is missing.",
            router_score_function="sigmoid",
            router_load_balancing="none",
            expert_bias=True,
            grouped_gemm=True,
            requires=("cuda", "transformer-engine"),
            expected={"cpu": "unsupported-by-build (needs CUDA and Transformer Engine)"},
            **_MOE,  # type: ignore[arg-type]
        ),
    )
}


def get_config(name: str) -> ModelConfig:
    """Return the named config or raise KeyError."""
    return CONFIGS[name]


def config_names() -> list[str]:
    """Return the names of all configs, sorted."""
    return sorted(CONFIGS)
