"""Build the model, DDP wrapper, optimizer and LR scheduler for a named config.

Import only inside a rank process after torch.distributed and Megatron's parallel state are up
(see jobs/rank/dist.py). Data is synthetic and keyed by (seed, step, global microbatch index), so a resumed run sees the
same batches as the uninterrupted one without any data-loader state, at any DP size: with one
microbatch per rank the index is the rank.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from jobs.configs import ModelConfig
from jobs.rank import device as rank_device


@dataclass
class Trainee:
    """Everything a phase needs to train and checkpoint one model replica."""

    config: ModelConfig
    ddp: Any  # megatron DistributedDataParallel
    optimizer: Any  # MegatronOptimizer (usually a ChainedOptimizer)
    scheduler: Any  # OptimizerParamScheduler
    name_of: dict[Any, str]
    loss_fn: Callable[[int], torch.Tensor]
    # loss of (step, global microbatch index): what a rank accumulating several microbatches runs
    micro_loss_fn: Callable[[int, int], torch.Tensor] | None = None
    iteration: int = 0  # the last completed step; saved, restored, and where a resume continues
    # Megatron's finalize_model_grads after backward (DP reduction, TP/PP reductions, expert-bias
    # update, reset of non-persistent MoE counters); False: the DP reduction alone
    finalize_grads: bool = True
    # pp > 1: the pipelined schedule runs forward + backward (jobs/rank/pipeline.py)
    pipelined: Callable[[int], tuple[torch.Tensor, float]] | None = None
    # a recipe-shaped config: (step, microbatches) -> the step's mean loss, through Megatron's own
    # schedule, which also reduces the grads (jobs/rank/schedule.py)
    scheduled: Callable[[int, int], torch.Tensor] | None = None
    samples_per_microbatch: int = 1

    def forward_backward(self, step: int) -> tuple[torch.Tensor, float]:
        """Run one step's forward and backward; -> (loss, 1.0), or (0, 0.0) on a stage without the loss."""
        if self.pipelined is not None:
            return self.pipelined(step)
        loss = self.loss_fn(step)
        self.backward(loss)
        return loss, 1.0

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the loss, scaled by the fp16 loss scaler as Megatron's schedules do."""
        if self.config.fp16:
            self.optimizer.scale_loss(loss).backward()
        else:
            loss.backward()

    def sync_grads(self) -> None:
        """Reduce this step's grads as Megatron's training loop does (finalize_model_grads, every layout).

        Besides the DP reduction it all-reduces TP / PP grads, updates the routers' expert bias from
        the step's token counts and zeroes the non-persistent counters; at tp = pp = 1 without an
        expert bias it does what finish_grad_sync alone did.
        """
        if self.finalize_grads:
            from megatron.core.distributed import finalize_model_grads

            finalize_model_grads([self.ddp])
        else:
            self.ddp.finish_grad_sync()

    def scheduler_increment(self, update_successful: bool, microbatches: int) -> int:
        """What the scheduler steps by after an update: 1, or (production) the step's samples if it applied."""
        if not self.config.scheduler_by_samples:
            return 1
        from megatron.core import parallel_state

        samples = microbatches * self.samples_per_microbatch * parallel_state.get_data_parallel_world_size()
        return samples if update_successful else 0

    def gather_params(self) -> None:
        """Finish the deferred param all-gather (overlap_param_gather): every param whole, hooks off.

        Megatron-LM's trainer does this before a save (disable_forward_pre_hook), so what is saved and
        snapshotted is the updated model, not the stale halves the next forward would gather.
        """
        self._gather_hook_off(param_sync=True)

    def regather_params_in_forward(self) -> None:
        """Turn the deferred param all-gather back on after gather_params (training goes on)."""
        if getattr(self.ddp, "use_forward_hook", False) and not self.ddp.remove_forward_pre_hook_handles:
            self.ddp.enable_forward_pre_hook()

    def start_resume_without_gather(self) -> None:
        """Start a resume with the forward pre-hook off, as Megatron-LM's trainer does for one step.

        The loaded params are whole on every rank; the trainer skips the first all-gather so that a
        load gone wrong on one rank does not spread through it, and turns the hook on after step one.
        """
        self._gather_hook_off(param_sync=False)

    def _gather_hook_off(self, param_sync: bool) -> None:
        if getattr(self.ddp, "use_forward_hook", False) and self.ddp.remove_forward_pre_hook_handles:
            self.ddp.disable_forward_pre_hook(param_sync=param_sync)

    @property
    def sub_optimizers(self) -> list[Any]:
        """Return the optimizers inside a ChainedOptimizer (or the optimizer itself)."""
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def sharded_model_state(self, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return the model's sharded state dict with Float16Module keys (no DDP prefix)."""
        # DDP's own sharded_state_dict adds a "module." prefix that load then cannot match.
        if metadata is None:
            return self.ddp.module.sharded_state_dict()
        return self.ddp.module.sharded_state_dict(metadata=metadata)


def batch_seed(seed: int, step: int, index: int) -> int:
    """Derive a stable 63-bit generator seed from (seed, step, global microbatch index)."""
    digest = hashlib.sha256(f"{seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _transformer_config(cfg: ModelConfig, tp: int = 1, ep: int = 1, pp: int = 1) -> Any:
    from megatron.core.transformer import TransformerConfig

    moe: dict[str, Any] = {}
    ffn = cfg.ffn_hidden_size or cfg.hidden_size * 2
    if pp > 1:  # activations between stages travel as bf16 (Megatron needs the dtype up front)
        moe.update(pipeline_model_parallel_size=pp, pipeline_dtype=torch.float16 if cfg.fp16 else torch.bfloat16)
        if cfg.virtual_pipeline > 1:  # interleaved: each stage holds several chunks of layers
            moe.update(virtual_pipeline_model_parallel_size=cfg.virtual_pipeline)
    if cfg.num_experts:
        moe.update(
            num_moe_experts=cfg.num_experts,
            moe_router_topk=cfg.moe_router_topk,
            # Megatron refuses top-1 routing with the softmax after top-k (a custom shape may ask for it)
            moe_router_pre_softmax=cfg.moe_router_topk == 1,
            moe_ffn_hidden_size=ffn,
            moe_token_dispatcher_type="allgather",
            moe_grouped_gemm=cfg.grouped_gemm,
            moe_router_load_balancing_type=cfg.router_load_balancing,
            moe_aux_loss_coeff=0.0 if cfg.router_load_balancing == "none" else 1e-2,
            moe_router_score_function=cfg.router_score_function,
            moe_router_enable_expert_bias=cfg.expert_bias,
            moe_router_dtype="fp32",
        )
        if cfg.expert_bias:
            moe.update(moe_router_bias_update_rate=1e-3)
        if cfg.shared_expert_size:
            moe.update(moe_shared_expert_intermediate_size=cfg.shared_expert_size)
    if cfg.mtp_num_layers:  # the MTP head (GPTModel builds it from get_gpt_mtp_block_spec)
        moe.update(mtp_num_layers=cfg.mtp_num_layers, mtp_loss_scaling_factor=cfg.mtp_loss_scaling_factor)
    if cfg.fp8:  # GPU check (compat.check_requirements refuses it without CUDA and Transformer Engine)
        moe.update(fp8=cfg.fp8, fp8_recipe="delayed")
    if cfg.gated_mlp:  # SwiGLU, as the Llama / Mixtral / Qwen / DeepSeek recipes train
        moe.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if cfg.per_token_loss:  # the schedule sums losses and finalize_model_grads divides by the step's tokens
        moe.update(calculate_per_token_loss=True)
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=ffn,
        num_attention_heads=cfg.num_attention_heads,
        # add_bias_linear=True breaks MoE at TP=1 (in-place op on a view in mlp.py).
        add_bias_linear=False,
        bf16=not cfg.fp16,
        fp16=cfg.fp16,
        params_dtype=torch.float16 if cfg.fp16 else torch.bfloat16,
        use_cpu_initialization=True,
        hidden_dropout=cfg.dropout,
        attention_dropout=cfg.dropout,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        bias_activation_fusion=False,
        # parallel layout; MoE with TP > 1 requires sequence parallelism (MoELayer refuses otherwise)
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        sequence_parallel=tp > 1,
        **moe,
    )


def _add_residual_gates(gpt: torch.nn.Module) -> None:
    """Give every MLP a learnable scalar gate applied to its output (kept FP32 later)."""

    def scale(module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
        out, bias = output
        gate: torch.Tensor = module.residual_gate  # type: ignore[assignment]
        return out * (1.0 + gate).to(out.dtype), bias

    for name, module in gpt.named_modules():
        if name.endswith(".mlp"):
            module.residual_gate = torch.nn.Parameter(torch.zeros(1))
            # replicated over TP; under sequence parallelism each TP rank sees part of the sequence,
            # so its grad is summed over the TP group like a layernorm's
            module.residual_gate.sequence_parallel = True  # type: ignore[attr-defined]
            module.register_forward_hook(scale)


def _input_to_fp32(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return (args[0].float(), *args[1:]), kwargs


def _output_to_half(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    # an FP32 linear between bf16 modules (the MTP's eh_proj): its output continues in the half dtype
    out, bias = output
    return out.to(module.half_dtype), bias  # type: ignore[union-attr]


def _keep_fp32(model: torch.nn.Module, cfg: ModelConfig) -> None:
    # Bridge-style "keep in FP32": Float16Module cast everything to bf16; promote chosen modules
    # back. A bf16 grad buffer (embedding first) then precedes the FP32 one in DDP.
    for name, module in model.named_modules():
        if any(name.endswith(s) for s in cfg.fp32_modules):
            module.float()
            if name.endswith("output_layer"):
                # the FP32 head gets the bf16 decoder output: cast it, as the FP32 router does its input
                module.register_forward_pre_hook(_input_to_fp32, with_kwargs=True)
            elif name.endswith("eh_proj"):
                # the MTP's projection of [embedding; hidden] (both bf16) feeds a bf16 transformer layer
                module.half_dtype = torch.float16 if cfg.fp16 else torch.bfloat16
                module.register_forward_pre_hook(_input_to_fp32, with_kwargs=True)
                module.register_forward_hook(_output_to_half)
    for name, param in model.named_parameters():
        if name.endswith("residual_gate"):
            param.data = param.data.float()


def _build_gpt(
    cfg: ModelConfig, tcfg: Any, vp_stage: int | None = None
) -> tuple[torch.nn.Module, Callable[..., torch.Tensor]]:
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if tcfg.sequence_parallel:  # TP > 1: norms that support sequence parallelism (jobs/rank/parallel_model.py)
        from jobs.rank.parallel_model import gpt_block_spec

        spec = gpt_block_spec(cfg.num_experts or None, cfg.num_layers // tcfg.pipeline_model_parallel_size)
    elif cfg.grouped_gemm or cfg.fp8:  # GPU checks (jobs/rank/compat.check_requirements refuses them elsewhere)
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=cfg.num_experts or None, moe_grouped_gemm=cfg.grouped_gemm
        )
    else:
        spec = get_gpt_layer_local_spec(num_experts=cfg.num_experts or None)
    mtp_spec = None
    if cfg.mtp_num_layers:  # each MTP depth reuses the decoder's last layer spec (no TE on CPU)
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        mtp_spec = get_gpt_mtp_block_spec(tcfg, spec, use_transformer_engine=cfg.grouped_gemm or bool(cfg.fp8))
    gpt = GPTModel(
        config=tcfg,
        transformer_layer_spec=spec,
        vocab_size=cfg.padded_vocab_size(tcfg.tensor_model_parallel_size),
        max_sequence_length=cfg.seq_length,
        position_embedding_type="rope",
        # each pipeline stage builds only its part. Untied output weights (the toy configs: the output
        # head is its own param, which `fp32_output_head` keeps in FP32) need no embedding group across
        # stages; tied ones (production's default) put a copy on the last stage that finalize_model_grads
        # keeps equal to the first stage's through the embedding group
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
        share_embeddings_and_output_weights=cfg.tied_embeddings,
        mtp_block_spec=mtp_spec,
        **({"vp_stage": vp_stage} if vp_stage is not None else {}),
    )
    if cfg.fp32_residual_gates:
        _add_residual_gates(gpt)

    def forward(model: torch.nn.Module, gen: torch.Generator) -> torch.Tensor:
        """Per-token losses (last pipeline stage) or hidden states (an earlier one) for one batch."""
        tok, pos = gpt_batch(cfg, gen)
        out: torch.Tensor = model(tok[:, :-1], pos, None, labels=tok[:, 1:])
        return out

    return gpt, forward


def gpt_batch(cfg: ModelConfig, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens with the next-token labels, position ids) of one GPT batch, on the rank's device.

    Drawn from the CPU generator (the same batch on every device), then moved: an embedding on the GPU
    fed CPU token ids fails in index_select.
    """
    here = rank_device.current()
    tok = torch.randint(0, cfg.vocab_size, (cfg.micro_batch_size, cfg.seq_length + 1), generator=gen).to(here)
    pos = torch.arange(cfg.seq_length, device=here).unsqueeze(0).expand(cfg.micro_batch_size, -1)
    return tok, pos


class LinearStack(torch.nn.Module):
    """bf16 square linears followed by FP32 square 'head' linears (equal numel everywhere).

    With `readout`, a 1-D input scale (no-weight-decay group) and a 1 x width readout (weight-decay
    group) of equal numel are added: the smallest params, so a layer-wise optimizer that deals
    params out smallest-first gives rank 0 the readout and leaves it nothing in the 1-D group.
    """

    def __init__(self, width: int, bf16_layers: int, fp32_layers: int, readout: bool = False) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        self.model_type = ModelType.encoder_or_decoder  # what Megatron's schedules ask every model
        self.body = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(bf16_layers))
        self.head = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(fp32_layers))
        self.scale = torch.nn.Parameter(torch.ones(width)) if readout else None
        self.readout = torch.nn.Linear(width, 1, bias=False) if readout else None

    def set_input_tensor(self, tensor: Any) -> None:
        """Megatron's schedules hand every model its pipeline input; a stack trained at PP 1 has none."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the bf16 body, then the FP32 head on an FP32 copy of the activations."""
        if self.scale is not None:
            x = x * self.scale
        for layer in self.body:
            x = torch.tanh(layer(x))
        x = x.float()
        for layer in self.head:
            x = layer(x)
        if self.readout is not None:
            x = self.readout(x.to(self.readout.weight.dtype)).float()
        return x

    def sharded_state_dict(self, prefix: str = "", *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Replicated sharded state dict: DP rank 0 writes, other ranks are replicas."""
        from megatron.core import parallel_state
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        rank = parallel_state.get_data_parallel_rank()
        return {
            f"{prefix}{n}": ShardedTensor.from_rank_offsets(f"{prefix}{n}", p, replica_id=rank)
            for n, p in self.named_parameters()
        }


def _build_linear_stack(cfg: ModelConfig) -> tuple[torch.nn.Module, Callable[..., torch.Tensor]]:
    net = LinearStack(cfg.hidden_size, cfg.bf16_layers, cfg.fp32_head_layers, cfg.readout)
    out_width = 1 if cfg.readout else cfg.hidden_size

    def forward(model: torch.nn.Module, gen: torch.Generator) -> torch.Tensor:
        here = rank_device.current()
        x = torch.randn(cfg.micro_batch_size, cfg.hidden_size, generator=gen).to(here)
        target = torch.sin(x.sum(dim=1, keepdim=True) + torch.arange(out_width, device=here))
        return (model(x).float() - target).pow(2)

    return net, forward


def _decoupled_lr(cfg: ModelConfig) -> dict[str, Any]:
    # the embedding and output layer's own LR bounds: their param groups get max_lr / min_lr overrides
    # that the scheduler reads per group (get_standard_config_overrides)
    if not cfg.decoupled_lr:
        return {}
    return {"decoupled_lr": cfg.decoupled_lr, "decoupled_min_lr": cfg.decoupled_min_lr or None}


def _scheduler(cfg: ModelConfig, opt: Any, total_steps: int, samples_per_step: int) -> Any:
    """The LR / weight-decay scheduler, counted in steps, or (production) in samples."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    unit = samples_per_step if cfg.scheduler_by_samples else 1
    extra: dict[str, Any] = {}
    if cfg.lr_decay_style == "WSD":
        extra.update(wsd_decay_steps=cfg.wsd_decay_steps * unit, lr_wsd_decay_style=cfg.lr_wsd_decay_style)
    if cfg.override_opt_param_scheduler:  # Bridge's default: the run's settings win over the checkpoint's
        extra.update(override_opt_param_scheduler=True, use_checkpoint_opt_param_scheduler=False)
    return OptimizerParamScheduler(
        opt,
        init_lr=cfg.lr_warmup_init,
        max_lr=cfg.lr,
        min_lr=cfg.min_lr,
        lr_warmup_steps=cfg.lr_warmup_steps * unit,
        lr_decay_steps=total_steps * unit,
        lr_decay_style=cfg.lr_decay_style,
        start_wd=cfg.weight_decay,
        end_wd=cfg.weight_decay,
        wd_incr_steps=total_steps * unit,
        wd_incr_style="constant",
        **extra,
    )


def _build_optimizer(cfg: ModelConfig, chunks: list[Any], total_steps: int,
                     samples_per_step: int = 1) -> tuple[Any, Any]:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    layerwise = cfg.optimizer == "layerwise-adam"
    fp16: dict[str, Any] = {}
    if cfg.fp16:  # loss_scale None: Megatron's DynamicGradScaler
        fp16 = dict(fp16=True, loss_scale=None, initial_loss_scale=cfg.initial_loss_scale,
                    loss_scale_window=cfg.loss_scale_window, hysteresis=2, min_loss_scale=1.0)
    ocfg = OptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        # The layer-wise wrapper adds the bf16 master weights itself, after sharding.
        bf16=not layerwise and not cfg.fp16,
        use_distributed_optimizer=not layerwise,
        clip_grad=cfg.clip_grad,
        **_decoupled_lr(cfg),
        **fp16,
    )
    opt = get_megatron_optimizer(ocfg, chunks)
    if layerwise:
        opt = _layerwise(opt, ocfg)
    return opt, _scheduler(cfg, opt, total_steps, samples_per_step)


def _layerwise(opt: Any, ocfg: Any) -> Any:
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.process_groups_config import ProcessGroupCollection

    def adam_init_state(inner: torch.optim.Optimizer, config: Any = None) -> None:
        for group in inner.param_groups:
            for p in group["params"]:
                if len(inner.state[p]) == 0:
                    inner.state[p]["exp_avg"] = torch.zeros_like(p.data)
                    inner.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)

    from jobs.rank.compat import layerwise_inner_optimizers

    subs = layerwise_inner_optimizers(list(getattr(opt, "chained_optimizers", [opt])))
    ocfg.bf16 = True
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    return LayerWiseDistributedOptimizer(subs, ocfg, pgs, init_state_fn_list=[adam_init_state] * len(subs))


def build(
    cfg: ModelConfig, seed: int, total_steps: int, init_seed: int | None = None, tp: int = 1, ep: int = 1,
    pp: int = 1, global_microbatches: int = 1,
) -> Trainee:
    """Build a freshly initialised, DDP-wrapped model with its optimizer and scheduler.

    `seed` keys the data; `init_seed` (default `seed`) seeds the weights and generators, so a
    resume can start from a different initialisation and every missing restore shows. `tp` / `ep` /
    `pp` must match the parallel state (jobs/rank/dist.py); a batch is keyed by the data-parallel
    rank, so the TP ranks and pipeline stages of one replica see the same tokens.
    """
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    torch.manual_seed(seed if init_seed is None else init_seed)
    model_parallel_cuda_manual_seed(seed if init_seed is None else init_seed)
    tcfg = _transformer_config(cfg, tp, ep, pp)
    if cfg.rerun_state_machine:  # before DDP: its buckets validate their grads through the machine
        from jobs.rank import rerun

        rerun.start()
    ddp_cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=cfg.optimizer == "distributed-adam",
        grad_reduce_in_fp32=cfg.grad_reduce_in_fp32,
        # several buckets per buffer, each reduced as its grads are ready and its params gathered in
        # the next forward (bucket_size 0 keeps DDP's default: one bucket for a model this small)
        overlap_grad_reduce=cfg.bucket_size > 0,
        overlap_param_gather=cfg.bucket_size > 0,
        bucket_size=cfg.bucket_size or None,
        check_for_nan_in_grad=cfg.rerun_state_machine,
    )
    chunks = []
    vpp = cfg.virtual_pipeline if pp > 1 else 1
    for vp_stage in range(vpp):  # one model, or a virtual pipeline's chunks (each its own DDP, as get_model)
        net, forward = (_build_gpt(cfg, tcfg, vp_stage if vpp > 1 else None) if cfg.kind == "gpt"
                        else _build_linear_stack(cfg))
        # initialised on the CPU (use_cpu_initialization: the same weights on every device), then moved to
        # the rank's device before Float16Module and DDP, as Megatron-LM's get_model does (a no-op on cpu)
        model = Float16Module(tcfg, net.to(rank_device.current()))
        _keep_fp32(model, cfg)
        # Megatron-LM buckets the first chunk only (disable_bucketing for the rest)
        extra = {"disable_bucketing": True} if vp_stage > 0 else {}
        chunks.append(DistributedDataParallel(tcfg, ddp_cfg, model, **extra))
    if vpp > 1:
        from jobs.rank.chunks import ChunkedDDP

        ddp: Any = ChunkedDDP(chunks)
    else:
        ddp = chunks[0]
    opt, sched = _build_optimizer(cfg, chunks, total_steps, global_microbatches * cfg.micro_batch_size)
    if cfg.fp16:  # the pipeline schedule scales the loss through the config, as Megatron-LM wires it
        tcfg.grad_scale_func = opt.scale_loss
    rank = parallel_state.get_data_parallel_rank()

    def gen_for(step: int, index: int | None = None) -> torch.Generator:
        # a batch is keyed by global microbatch index: this DP rank's own unless a reshard accumulates
        return torch.Generator().manual_seed(batch_seed(seed, step, rank if index is None else index))

    def micro_loss_fn(step: int, index: int) -> torch.Tensor:
        return forward(ddp, gen_for(step, index)).float().mean()

    def loss_fn(step: int) -> torch.Tensor:
        return forward(ddp, gen_for(step)).float().mean()

    pipelined = scheduled = None
    if cfg.recipe_loop:  # every layout through Megatron's schedule, wired as Megatron-LM's trainer wires it
        from jobs.rank.schedule import scheduled_step, wire_trainer_config

        wire_trainer_config(tcfg, chunks)
        scheduled = scheduled_step(chunks, cfg, forward, gen_for, rank)
    elif pp > 1:
        from jobs.rank.pipeline import forward_backward

        pipelined = forward_backward(ddp, cfg, forward, gen_for)
    name_of = {p: n for n, p in ddp.named_parameters()}
    return Trainee(cfg, ddp, opt, sched, name_of, loss_fn, micro_loss_fn, pipelined=pipelined, scheduled=scheduled,
                   samples_per_microbatch=cfg.micro_batch_size)
