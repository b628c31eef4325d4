"""Inject the catalogue's resume bugs (jobs/selftest/catalogue.py) into Megatron-Core, in this process.

Each mutant wraps a Megatron-Core (or harness) function with a monkeypatch; `install` returns an
undo. Patches act only in the phase named in their registration, and ask torch.distributed for
the rank when they run, so they work in a fresh interpreter and in a forked child alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

Patch = tuple[Any, str, Any]  # (owner, attribute, original)
RESUME, SAVE, BOTH = ("resume",), ("train_and_save",), ("train_and_save", "resume")


def _last_rank() -> bool:
    return torch.distributed.get_rank() == torch.distributed.get_world_size() - 1


def _dist_opt() -> Any:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return DistributedOptimizer


def _after(owner: Any, attr: str, hook: Callable[..., Any]) -> Patch:
    """Wrap owner.attr so that hook(self, result, *args, **kwargs) runs after it; hook's value is returned."""
    original = getattr(owner, attr)

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return hook(self, original(self, *args, **kwargs), *args, **kwargs)

    setattr(owner, attr, wrapper)
    return owner, attr, original


def _before(owner: Any, attr: str, hook: Callable[..., None]) -> Patch:
    original = getattr(owner, attr)

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    setattr(owner, attr, wrapper)
    return owner, attr, original


def _states(opt: Any) -> list[dict[str, Any]]:
    return list(opt.optimizer.state.values())


def model_weight_skipped(pick: Callable[[str], bool] = lambda name: True) -> list[Patch]:
    """The model load keeps the fresh build's value of the first 2-D weight whose name `pick` accepts."""
    from megatron.core.transformer.module import Float16Module

    # torch_dist loads model tensors in place during the read, so the fresh value is taken when
    # the load's sharded state dict is built (before the read) and put back by load_state_dict.
    fresh: dict[str, Any] = {}

    def remember(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        if not fresh:
            param = next(p for n, p in self.named_parameters() if p.dim() == 2 and pick(n))
            fresh.update(param=param, value=param.detach().clone())
        return result

    def put_back(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        if fresh:
            fresh["param"].data.copy_(fresh["value"])
        return result

    return [_after(Float16Module, "sharded_state_dict", remember), _after(Float16Module, "load_state_dict", put_back)]


def main_params_from_model() -> list[Patch]:
    return [_after(_dist_opt(), "load_state_dict", lambda self, r, *a, **k: self._copy_model_params_to_main_params())]


def exp_avg_sq_reset() -> list[Patch]:
    def zero(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for s in _states(self):
            s["exp_avg_sq"].zero_()
        return result

    return [_after(_dist_opt(), "load_state_dict", zero)]


def _walk_groups(node: Any, fn: Callable[[dict[str, Any]], None]) -> None:
    if isinstance(node, dict):
        for g in node.get("param_groups") or [] if isinstance(node.get("param_groups"), list) else []:
            fn(g)
        for v in node.values():
            _walk_groups(v, fn)


def adam_step_saved_off_by_one() -> list[Patch]:
    def minus_one(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        _walk_groups(result, lambda g: g.__setitem__("step", g["step"] - 1) if "step" in g else None)
        return result

    return [_after(_dist_opt(), "state_dict", minus_one)]


def scheduler_one_step_behind() -> list[Patch]:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    original = OptimizerParamScheduler.load_state_dict

    def behind(self: Any, state_dict: dict[str, Any]) -> None:
        original(self, {**state_dict, "num_steps": state_dict["num_steps"] - 1})

    OptimizerParamScheduler.load_state_dict = behind  # type: ignore[method-assign]
    return [(OptimizerParamScheduler, "load_state_dict", original)]


def iteration_one_behind() -> list[Patch]:
    from jobs.rank import checkpoint

    original = checkpoint.build_save_state

    def behind(tr: Any, sharding: str, iteration: int) -> dict[str, Any]:
        return original(tr, sharding, iteration - 1)

    checkpoint.build_save_state = behind
    return [(checkpoint, "build_save_state", original)]


def rng_tracker_not_restored() -> list[Patch]:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    original = CudaRNGStatesTracker.set_states
    CudaRNGStatesTracker.set_states = lambda self, states: None
    return [(CudaRNGStatesTracker, "set_states", original)]


def _is_loading(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # sharded_state_dict(model_sharded_state_dict, is_loading=False, ...): callers pass it either way
    return bool(kwargs.get("is_loading", args[1] if len(args) > 1 else False))


def save_rounds_main_params() -> list[Patch]:
    def rounding(self: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loading(args, kwargs):
            for group in self.shard_fp32_from_float16_groups:
                for shard in group:
                    shard.data.copy_(shard.data.bfloat16().float())
        return result

    return [_after(_dist_opt(), "sharded_state_dict", rounding)]


def index_map_swap() -> list[Patch]:
    def swap(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        from jobs.rank.probes.index_map import own_shards

        own = own_shards(self)
        seen: dict[tuple[int, int], Any] = {}
        for param, (g, _) in list(self.model_param_group_index_map.items()):
            key = (g, int(own[param].numel()))
            if key in seen:
                other = seen[key]
                m = self.model_param_group_index_map
                m[param], m[other] = m[other], m[param]
                break
            seen[key] = param
        return result

    return [_after(_dist_opt(), "__init__", swap)]


def adam_step_loaded_elsewhere() -> list[Patch]:
    """After the optimizer load every Adam `step` is 100 past what the load left (neither the
    priming value nor the checkpoint's): a restore bug restore-adam-step must not correct."""

    def shift(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for s in _states(self):
            if isinstance(s.get("step"), torch.Tensor):
                where = getattr(s["step"], "device", None)
                s["step"] = torch.tensor(float(s["step"]) + 100.0, dtype=torch.float32, device=where)
        return result

    return [_after(_dist_opt(), "load_state_dict", shift)]


def exp_avg_sq_lossy_on_load() -> list[Patch]:
    """After the optimizer load every exp_avg_sq passes through bf16 (a lossy reshard of one moment)."""

    def round_trip(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for s in _states(self):
            if isinstance(s.get("exp_avg_sq"), torch.Tensor):
                s["exp_avg_sq"].copy_(s["exp_avg_sq"].to(torch.bfloat16).to(s["exp_avg_sq"].dtype))
        return result

    return [_after(_dist_opt(), "load_state_dict", round_trip)]


def moments_lost_on_last_rank() -> list[Patch]:
    def lose(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        if _last_rank():
            for s in _states(self):
                s["exp_avg"].zero_()
        return result

    return [_after(_dist_opt(), "load_state_dict", lose)]


def group_lr_skewed_on_last_rank() -> list[Patch]:
    def skew(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        if _last_rank():
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * 2 + 1e-3
        return result

    return [_after(_dist_opt(), "load_state_dict", skew)]


def adam_eps_not_restored() -> list[Patch]:
    def eps(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for group in self.optimizer.param_groups:
            group["eps"] = 1e-6
        return result

    return [_after(_dist_opt(), "load_state_dict", eps)]


def clip_grad_changed_on_resume() -> list[Patch]:
    def clip(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        self.config.clip_grad = 1e-3
        return result

    return [_after(_dist_opt(), "load_state_dict", clip)]


def scheduler_ignores_group_lr_bounds() -> list[Patch]:
    """The resumed scheduler gives every group the default LR bounds (a group's own max_lr / min_lr ignored)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    original = OptimizerParamScheduler.get_lr

    @functools.wraps(original)
    def get_lr(self: Any, param_group: dict[str, Any], *a: Any, **k: Any) -> Any:
        return original(self, {key: v for key, v in param_group.items() if key not in ("max_lr", "min_lr")}, *a, **k)

    OptimizerParamScheduler.get_lr = get_lr  # type: ignore[method-assign]
    return [(OptimizerParamScheduler, "get_lr", original)]


def rerun_machine_disabled_on_resume() -> list[Patch]:
    """The resumed process starts the rerun state machine disabled (its grads validated by nothing)."""
    from megatron.core import rerun_state_machine as module

    original = module.initialize_rerun_state_machine

    @functools.wraps(original)
    def disabled(**kwargs: Any) -> Any:
        return original(**{**kwargs, "mode": module.RerunMode.DISABLED})

    module.initialize_rerun_state_machine = disabled
    return [(module, "initialize_rerun_state_machine", original)]


def build_lacks_sharding_type() -> list[Patch]:
    def unknown(self: Any, *args: Any, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        sharding = (metadata or {}).get("distrib_optim_sharding_type")
        raise NotImplementedError(f"Unknown sharding_type: {sharding}")

    return [_before(_dist_opt(), "sharded_state_dict", unknown)]


def benign_state_in_new_storage() -> list[Patch]:
    def copy(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for s in _states(self):
            for key, value in list(s.items()):
                if isinstance(value, torch.Tensor):
                    s[key] = value.clone()
        return result

    return [_after(_dist_opt(), "load_state_dict", copy)]


def common_state_iteration_stale() -> list[Patch]:
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy

    def stale(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        # the common.pt reader hands back the iteration of the checkpoint before this one
        if isinstance(result, dict) and isinstance(result.get("iteration"), int):
            result = {**result, "iteration": result["iteration"] - 1}
        return result

    return [_after(TorchCommonLoadStrategy, "load_common", stale)]


def shared_expert_weight_skipped() -> list[Patch]:
    return model_weight_skipped(lambda name: ".shared_experts." in name)


def mtp_head_skipped_on_load() -> list[Patch]:
    """The model load leaves every multi-token-prediction parameter at the fresh build's value."""
    from megatron.core.transformer.module import Float16Module

    fresh: dict[int, tuple[Any, Any]] = {}

    def remember(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        # torch_dist loads in place during the read: take the fresh values before it (see model_weight_skipped)
        if not fresh:
            fresh.update({id(p): (p, p.detach().clone()) for n, p in self.named_parameters() if ".mtp." in n})
        return result

    def put_back(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for param, value in fresh.values():
            param.data.copy_(value)
        return result

    return [_after(Float16Module, "sharded_state_dict", remember), _after(Float16Module, "load_state_dict", put_back)]


MTP_SWAPPED = ("enorm.weight", "hnorm.weight")


def _shards_by_name(opt: Any) -> dict[str, Any]:
    """This rank's optimizer-state keys (FP32 main shards) by model parameter name."""
    names = {p: n for chunk in opt.model_chunks for n, p in chunk.named_parameters()}
    out = {}
    for model_group, main_group in zip(opt.model_float16_groups, opt.shard_fp32_from_float16_groups, strict=True):
        out.update({names[p]: main for p, main in zip(model_group, main_group, strict=True) if p in names})
    for model_group, main_group in zip(opt.model_fp32_groups, opt.shard_fp32_groups, strict=True):  # FP32 params
        out.update({names[p]: main for p, main in zip(model_group, main_group, strict=True) if p in names})
    return out


def mtp_moments_swapped() -> list[Patch]:
    """After the optimizer load, each MTP layer's enorm and hnorm swap Adam moments (restored onto the wrong param).

    Both are [hidden] norm weights of one group, so a key mix-up of the two loads without any shape
    error. A rank holding unequal shards of the pair (the DP split runs through them) leaves them.
    """

    def swap(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        shards = _shards_by_name(self)
        for name, main in shards.items():
            if ".mtp." not in name or not name.endswith(MTP_SWAPPED[0]):
                continue
            other = shards.get(name[: -len(MTP_SWAPPED[0])] + MTP_SWAPPED[1])
            if other is None or other.numel() != main.numel():
                continue
            a_state, b_state = self.optimizer.state[main], self.optimizer.state[other]
            for key in ("exp_avg", "exp_avg_sq"):
                held = a_state[key].clone()
                a_state[key].copy_(b_state[key])
                b_state[key].copy_(held)
        return result

    return [_after(_dist_opt(), "load_state_dict", swap)]


def expert_bias_zeroed_on_load() -> list[Patch]:
    from megatron.core.transformer.module import Float16Module

    def zero(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        for module in self.modules():
            if getattr(module, "expert_bias", None) is not None:
                module.expert_bias.zero_()
        return result

    return [_after(Float16Module, "load_state_dict", zero)]


def expert_bias_not_checkpointed() -> list[Patch]:
    """Every router registers expert_bias as a non-persistent buffer (a one-word change to the router's
    register_buffer): state_dict and sharded_state_dict leave it out, so the checkpoint lacks it, the
    strict load does not miss it and the resume keeps the fresh build's zeros."""
    from megatron.core.transformer.moe.router import TopKRouter

    def not_persistent(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        if getattr(self, "expert_bias", None) is not None:
            self._non_persistent_buffers_set.add("expert_bias")
        return result

    return [_after(TopKRouter, "__init__", not_persistent)]


def loss_scaler_not_restored() -> list[Patch]:
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    original = DynamicGradScaler.load_state_dict
    DynamicGradScaler.load_state_dict = lambda self, state_dict: None  # type: ignore[method-assign]
    return [(DynamicGradScaler, "load_state_dict", original)]


def async_save_stages_late() -> list[Patch]:
    from megatron.core.dist_checkpointing.strategies.async_utils import TemporalAsyncCaller

    schedule, done = TemporalAsyncCaller.schedule_async_call, TemporalAsyncCaller.is_current_async_call_done

    def defer(self: Any, async_req: Any) -> None:
        # the staging copy and the writer start only when the trainer next polls, after step N+1 (on a
        # GPU: a non-blocking D2H copy nobody waited for): the live step-N+1 tensors get written as step N
        self._parity_deferred = async_req

    def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = self.__dict__.pop("_parity_deferred", None)
        if request is not None:
            schedule(self, request)
        return done(self, *args, **kwargs)

    TemporalAsyncCaller.schedule_async_call = defer  # type: ignore[method-assign]
    TemporalAsyncCaller.is_current_async_call_done = poll  # type: ignore[method-assign]
    return [(TemporalAsyncCaller, "schedule_async_call", schedule),
            (TemporalAsyncCaller, "is_current_async_call_done", done)]


def fully_parallel_exchange_lost_on_last_rank() -> list[Patch]:
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    original = FullyParallelLoadStrategyWrapper.fill_in_deferred_sharded_tensors

    def lose(sharded_state_dict: Any, loaded_tensors: dict[Any, torch.Tensor]) -> None:
        # the last rank fills the embedding it received in the exchange with zeros
        if _last_rank():
            loaded_tensors = {
                k: torch.zeros_like(v) if str(k[0]).endswith("embedding.word_embeddings.weight") else v
                for k, v in loaded_tensors.items()
            }
        original(sharded_state_dict, loaded_tensors)

    FullyParallelLoadStrategyWrapper.fill_in_deferred_sharded_tensors = staticmethod(lose)  # type: ignore[assignment]
    return [(FullyParallelLoadStrategyWrapper, "fill_in_deferred_sharded_tensors", staticmethod(original))]


def benign_load_priming_noise() -> list[Patch]:
    def noise(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        # the load-priming dummies get random values instead of zeros: the load overwrites them all
        gen = torch.Generator().manual_seed(1234)
        for s in _states(self):
            for value in s.values():
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                    value.copy_(torch.rand(value.shape, generator=gen).to(value.dtype))
        return result

    return [_after(_dist_opt(), "_init_optimizer_states_with_dummy_values", noise)]


def benign_stale_grads_after_load() -> list[Patch]:
    def garbage(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        # grad buffers full of junk after the load: every step zeroes them before its backward
        for buffer in self.buffers:
            buffer.grad_data.fill_(3.0)
        return result

    return [_after(_dist_opt(), "load_state_dict", garbage)]


def benign_rng_drawn_before_load() -> list[Patch]:
    def draw(self: Any, *a: Any, **k: Any) -> None:
        torch.rand(17)

    return [_before(_dist_opt(), "load_state_dict", draw)]


NOISE = 1e-7


def benign_gradient_noise() -> list[Patch]:
    # GPU noise on CPU: every step's main-param gradients get a seeded perturbation of NOISE relative
    # (float32 reduction-order noise is of that order).
    # The generator restarts in each phase, so the resume draws other noise than the save did at
    # the same step, as a non-deterministic GPU reduction would: `default` must pass, `exact` fail.
    gen: list[torch.Generator] = []

    def perturb(self: Any, result: Any, *a: Any, **k: Any) -> Any:
        if not gen:
            gen.append(torch.Generator().manual_seed(20261201 + torch.distributed.get_rank()))
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    noise = torch.randn(p.grad.shape, generator=gen[0], dtype=torch.float32)  # CPU generator
                    p.grad.add_(p.grad * noise.to(p.grad.device, p.grad.dtype) * NOISE)
        return result

    from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer

    return [_after(MixedPrecisionOptimizer, "prepare_grads", perturb)]


REGISTRY: dict[str, tuple[tuple[str, ...], Callable[[], list[Patch]]]] = {
    "model-weight-skipped": (RESUME, model_weight_skipped),
    "main-params-from-model": (RESUME, main_params_from_model),
    "exp-avg-sq-reset": (RESUME, exp_avg_sq_reset),
    "adam-step-saved-off-by-one": (SAVE, adam_step_saved_off_by_one),
    "scheduler-one-step-behind": (RESUME, scheduler_one_step_behind),
    "iteration-one-behind": (SAVE, iteration_one_behind),
    "rng-tracker-not-restored": (RESUME, rng_tracker_not_restored),
    "save-rounds-main-params": (SAVE, save_rounds_main_params),
    "index-map-swap": (BOTH, index_map_swap),
    "index-map-swap-beside-bug-a": (BOTH, index_map_swap),
    "adam-step-loaded-elsewhere": (RESUME, adam_step_loaded_elsewhere),
    "exp-avg-sq-lossy-on-load": (RESUME, exp_avg_sq_lossy_on_load),
    "moments-lost-on-last-rank": (RESUME, moments_lost_on_last_rank),
    "group-lr-skewed-on-last-rank": (RESUME, group_lr_skewed_on_last_rank),
    "adam-eps-not-restored": (RESUME, adam_eps_not_restored),
    "clip-grad-changed-on-resume": (RESUME, clip_grad_changed_on_resume),
    "build-lacks-sharding-type": (SAVE, build_lacks_sharding_type),
    "scheduler-ignores-group-lr-bounds": (RESUME, scheduler_ignores_group_lr_bounds),
    "rerun-machine-disabled-on-resume": (RESUME, rerun_machine_disabled_on_resume),
    "benign-state-in-new-storage": (RESUME, benign_state_in_new_storage),
    "common-state-iteration-stale": (RESUME, common_state_iteration_stale),
    "expert-bias-zeroed-on-load": (RESUME, expert_bias_zeroed_on_load),
    "expert-bias-not-checkpointed": (BOTH, expert_bias_not_checkpointed),
    "loss-scaler-not-restored": (RESUME, loss_scaler_not_restored),
    "shared-expert-weight-skipped": (RESUME, shared_expert_weight_skipped),
    "async-save-stages-late": (SAVE, async_save_stages_late),
    "fully-parallel-exchange-lost-on-last-rank": (RESUME, fully_parallel_exchange_lost_on_last_rank),
    "mtp-head-skipped-on-load": (RESUME, mtp_head_skipped_on_load),
    "mtp-moments-swapped": (RESUME, mtp_moments_swapped),
    "benign-load-priming-noise": (RESUME, benign_load_priming_noise),
    "benign-stale-grads-after-load": (RESUME, benign_stale_grads_after_load),
    "benign-rng-drawn-before-load": (RESUME, benign_rng_drawn_before_load),
    "benign-gradient-noise": (BOTH, benign_gradient_noise),
}


def install(names: tuple[str, ...] | list[str], phase: str) -> Callable[[], None]:
    """Apply the named mutants that act in `phase`; return a function that undoes them (in reverse)."""
    patches: list[Patch] = []
    for name in names:
        phases, make = REGISTRY[name]
        if phase in phases:
            patches += make()

    def undo() -> None:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)

    return undo
