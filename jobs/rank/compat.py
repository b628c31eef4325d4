"""What the Megatron-Core build under test offers, asked before it is used.

The harness spans releases 0.12.x … 0.19.x (0.17+ on Python 3.12). A spec option a build lacks (a sharding type added
later) raises `UnsupportedByBuild` up front, in the build stage, so it is reported as
`unsupported-by-build` naming what is missing, never as a crash blamed on a Megatron bug. A
probe or workaround whose target a build lays out differently reports itself "not applicable on
this build" with the reason, and the run goes on.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jobs.configs import CONFIGS
from jobs.spec import RunSpec

T = TypeVar("T")
NOT_APPLICABLE = "not applicable on this build"


class UnsupportedByBuild(RuntimeError):
    """A spec option the build under test does not offer; the message names what is missing."""

    def __init__(self, option: str, missing: str) -> None:
        self.option = option
        self.missing = missing
        super().__init__(f"{option} is not supported by this build (megatron-core {megatron_version()}): {missing}")


def megatron_version() -> str:
    """The version string of the imported megatron.core (or '?')."""
    try:
        import megatron.core

        return str(getattr(megatron.core, "__version__", "?"))
    except ImportError:
        return "?"


@functools.cache
def sharding_types() -> tuple[str, ...]:
    """The optimizer sharding types this build's DistributedOptimizer names in its source.

    Releases dispatch on string literals (`sharding_type == 'dp_reshardable'`); a type that never
    appears cannot be saved (0.13/0.14: NotImplementedError 'Unknown sharding_type').
    """
    from megatron.core.optimizer import distrib_optimizer

    source = Path(str(distrib_optimizer.__file__)).read_text()
    offered = set(re.findall(r"""sharding_type\s*[!=]=\s*['"](\w+)['"]""", source))
    offered |= set(re.findall(r"""['"](\w+)['"]\s*[!=]=\s*sharding_type""", source))
    return tuple(sorted(offered))


# Optimizer kinds (jobs/configs.py) that need a module not every release ships.
OPTIMIZER_MODULES = {"layerwise-adam": "megatron.core.optimizer.layer_wise_optimizer"}


def check_optimizer(kind: str) -> None:
    """Raise UnsupportedByBuild when this build lacks the module an optimizer kind is built from."""
    module = OPTIMIZER_MODULES.get(kind)
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        raise UnsupportedByBuild(f"optimizer {kind!r}", f"it has no {module}") from None


def check_spec(spec: RunSpec) -> None:
    """Raise UnsupportedByBuild for an option of spec this build does not have."""
    check_optimizer(CONFIGS[spec.config].optimizer)
    check_requirements(spec.config, CONFIGS[spec.config].requires)
    offered = sharding_types()
    if spec.sharding not in offered:
        raise UnsupportedByBuild(
            f"sharding {spec.sharding!r}",
            f"its DistributedOptimizer offers only {', '.join(offered) or 'no sharding types'}",
        )
    if spec.reshards:
        check_reshard(spec)
    check_recipe_settings(CONFIGS[spec.config])


# Where each recipe setting lives in Megatron-Core: (the class, its module, how a build offers it)
_RECIPE_HOMES = {
    "overlap_grad_reduce": ("megatron.core.distributed", "DistributedDataParallelConfig"),
    "overlap_param_gather": ("megatron.core.distributed", "DistributedDataParallelConfig"),
    "bucket_size": ("megatron.core.distributed", "DistributedDataParallelConfig"),
    "decoupled_lr": ("megatron.core.optimizer", "OptimizerConfig"),
    "decoupled_min_lr": ("megatron.core.optimizer", "OptimizerConfig"),
    "calculate_per_token_loss": ("megatron.core.transformer", "TransformerConfig"),
    "gated_linear_unit": ("megatron.core.transformer", "TransformerConfig"),
    "wsd_decay_steps": ("megatron.core.optimizer_param_scheduler", "OptimizerParamScheduler"),
    "override_opt_param_scheduler": ("megatron.core.optimizer_param_scheduler", "OptimizerParamScheduler"),
}


def _offers(module: str, owner: str, name: str) -> bool:
    cls = getattr(importlib.import_module(module), owner)
    fields = getattr(cls, "__dataclass_fields__", None)
    return name in fields if fields is not None else name in inspect.signature(cls.__init__).parameters


def check_recipe_settings(cfg: Any) -> None:
    """Raise UnsupportedByBuild for a production-recipe setting this build's Megatron-Core lacks (an older one)."""
    missing = [f"{owner}.{name}" for name in cfg.megatron_settings if name in _RECIPE_HOMES
               for module, owner in [_RECIPE_HOMES[name]] if not _offers(module, owner, name)]
    if missing:
        raise UnsupportedByBuild(f"config {cfg.name!r}", f"this build has no {', '.join(missing)}")


def check_requirements(config: str, requires: tuple[str, ...]) -> None:
    """Raise UnsupportedByBuild when a GPU-check config (CUDA, Transformer Engine) runs without them."""
    import torch

    if "cuda" in requires and not torch.cuda.is_available():
        raise UnsupportedByBuild(f"config {config!r}", "it needs a CUDA device (a GPU check) and none is present")
    if "transformer-engine" in requires and importlib.util.find_spec("transformer_engine") is None:
        raise UnsupportedByBuild(f"config {config!r}", "it needs Transformer Engine, which is not installed")


# --- resume under another DP layout (resume_dp) ---


@functools.cache
def dp_reshardable_types() -> tuple[str, ...]:
    """The sharding types whose checkpoints this build says load at another DP size.

    0.16.1 names its fully reshardable formats (`checkpoint_fully_reshardable_formats`) and
    documents dp_reshardable as "resharding only in DP dimension"; dp_zero_gather_scatter
    gathers the whole state on DP rank 0 and scatters it again at load, so no DP size is in it.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    fully = set(getattr(DistributedOptimizer, "checkpoint_fully_reshardable_formats", ()))
    doc = " ".join((DistributedOptimizer.sharded_state_dict.__doc__ or "").split())
    dp_only = {"dp_reshardable"} if "resharding only in DP dimension" in doc else set()
    return tuple(sorted((fully | dp_only | {"dp_zero_gather_scatter"}) & set(sharding_types())))


def check_reshard(spec: RunSpec) -> None:
    """Raise UnsupportedByBuild when this build cannot load the spec's checkpoint at resume_dp ranks."""
    from jobs.configs import get_config

    option = f"resume_dp {spec.resume_dp} (saved at dp {spec.dp})"
    if spec.reshards_model:
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        fully = set(getattr(DistributedOptimizer, "checkpoint_fully_reshardable_formats", ()))
        if spec.sharding not in fully:
            raise UnsupportedByBuild(
                f"a resume on another layout ({spec.layout_change})",
                f"this build names no fully reshardable format {spec.sharding!r} "
                f"(checkpoint_fully_reshardable_formats: {', '.join(sorted(fully)) or 'none'})",
            )
        if get_config(spec.config).num_experts and _crosses_expert_parallel_one(spec):
            raise UnsupportedByBuild(
                f"a resume on another layout ({spec.layout_change})",
                "at EP 1 Megatron-Core trains the experts as dense params (`allreduce` is "
                "`expert_model_parallel_size > 1`), so the optimizer chain has one optimizer on one side and two "
                "on the other, and this build's ChainedOptimizer.load_state_dict hands a chain's saved state to a "
                "single optimizer whole (KeyError 'optimizer'); resume at another EP size above 1 instead",
            )
        return
    if get_config(spec.config).optimizer == "layerwise-adam":
        from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

        doc = " ".join((LayerWiseDistributedOptimizer.sharded_state_dict.__doc__ or "").split())
        if "fixed DP usage only" in doc:  # it zeroes every replica_id: the checkpoint has one DP layout
            raise UnsupportedByBuild(
                option, f"config {spec.config!r}: LayerWiseDistributedOptimizer checkpoints are for fixed DP usage only"
            )
        return
    reshardable = dp_reshardable_types()
    if spec.sharding not in reshardable:
        raise UnsupportedByBuild(
            option,
            f"sharding {spec.sharding!r} does not reshard across DP on this build; "
            f"these do: {', '.join(reshardable) or 'none'}",
        )


def _crosses_expert_parallel_one(spec: RunSpec) -> bool:
    """Whether the EP size goes from 1 to above 1 or back, on a build whose chain cannot load across that."""
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    ep_saved, ep_resumed = spec.layout("train_and_save").ep, spec.layout("resume").ep
    if (ep_saved == 1) == (ep_resumed == 1):
        return False
    try:
        source = inspect.getsource(ChainedOptimizer.load_state_dict)
    except (OSError, TypeError):
        return False  # no source to read: let the run answer
    # the build's one-optimizer path loads whatever it is given, a chain's dict of optimizers included
    return "self.chained_optimizers[0].load_state_dict(state_dict)" in source


def not_applicable(reason: str, **empty: Any) -> dict[str, Any]:
    """A probe or workaround report that says why it could not look on this build."""
    return {"applicable": False, "reason": f"{NOT_APPLICABLE}: {reason}", **empty}


def guarded(fn: Callable[..., dict[str, Any]], **empty: Any) -> Callable[..., dict[str, Any]]:
    """Wrap a probe so a build that lacks an attribute it reads gives 'not applicable', not a crash.

    Only AttributeError counts: it is what a renamed or missing Megatron attribute raises. Any
    other error is a real failure of the probe and propagates.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return fn(*args, **kwargs)
        except AttributeError as exc:
            return not_applicable(f"{type(exc).__name__}: {exc}", **empty)

    return wrapper


def _mtp_inference_linear_shim() -> list[str]:
    """Main (0.20) without Transformer Engine: every MTP layer's build raises in `isinstance`.

    `MultiTokenPredictionLayer.__init__` asks `is_inference_column_parallel_linear(self.eh_proj)`,
    an isinstance against the inference-optimized TE linears, which are no classes without TE
    ("isinstance() arg 2 must be a type"), so no MTP model can be built on a CPU host. Without TE no
    module can be such a linear: the answer is False. Applied only where the build's own check raises
    on a plain module.
    """
    try:
        from megatron.core.transformer import multi_token_prediction as mtp
    except ImportError:
        return []
    check = getattr(mtp, "is_inference_column_parallel_linear", None)
    if check is None or getattr(check, "_parity_shim", False):
        return []
    import torch

    try:
        check(torch.nn.Identity())
        return []
    except TypeError:
        pass

    def no_inference_linears_without_te(module: Any) -> bool:
        return False

    no_inference_linears_without_te._parity_shim = True  # type: ignore[attr-defined]
    mtp.is_inference_column_parallel_linear = no_inference_linears_without_te
    return ["multi_token_prediction.is_inference_column_parallel_linear: False without TE (main)"]


def install_shims() -> list[str]:
    """Patch, in this process only, what an old build cannot do without GPU libraries; return their names.

    0.12.x without Transformer Engine: `quantize_param_shard` always raises "Invalid Transformer
    Engine version", even with no FP8 params to quantize, so every distributed-optimizer step
    fails. With nothing to quantize it has nothing to do; with FP8 params it still raises.
    """
    applied = _numpy_product_shim() + _mtp_inference_linear_shim()
    try:
        from megatron.core import fp8_utils
    except ImportError:  # a build without the module has nothing of it to shim
        return applied
    impl = getattr(fp8_utils, "_quantize_param_shard_impl", None)
    if impl is not None and not getattr(impl, "_parity_shim", False) and _is_te_fallback(impl):

        def quantize_nothing(model_params: Any, *args: Any, **kwargs: Any) -> None:
            if len(model_params) == 0:
                return None
            return impl(model_params, *args, **kwargs)

        quantize_nothing._parity_shim = True  # type: ignore[attr-defined]
        fp8_utils._quantize_param_shard_impl = quantize_nothing
        applied.append("fp8_utils.quantize_param_shard: no-op without FP8 params (0.12.x, no TE)")
    return applied


@functools.cache
def sync_save_forks() -> bool:
    """Whether this build's synchronous dist_checkpointing save writes from a forked process.

    0.12.x-0.14.x: the default torch_dist save strategy schedules the request on the module-level
    `AsyncCallsQueue` (a forked writer, TemporalAsyncCaller) and finalizes it at once; the writer
    reports through `filesystem_async._results_queue`, so that queue must reach another process.
    0.15+ call `async_request.execute_sync()` (the writer runs in this process). Found by reading
    the `save` of the strategy the build itself picks by default (its class moved between modules:
    `strategies.base` is gone on main), never by a module path. Read, never called.
    """
    try:
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

        strategy = type(get_default_save_sharded_strategy())
    except (ImportError, AttributeError, TypeError, ValueError):
        return True  # unknown: the cross-process queue works either way
    for cls in strategy.__mro__:
        save = cls.__dict__.get("save")
        if save is None:
            continue
        try:
            source = inspect.getsource(save)
        except (OSError, TypeError):
            return True
        if "execute_sync" in source:
            return False
        if "async_sharded_save" in source or "schedule" in source or "async_request" in source:
            return True
    return True


def prime_optimizer_state(opt: Any) -> None:
    """Give a DistributedOptimizer's empty torch-Adam state the entries a load fills in place.

    0.16 has `_init_optimizer_states_with_dummy_values`; 0.12.x-0.14.x lack it, and their
    `state_dict()` asserts one Adam `step` across an empty state. The same priming inline there:
    a step on zero grads, its values overwritten by the load.
    """
    import torch

    init = getattr(opt, "_init_optimizer_states_with_dummy_values", None)
    if init is not None:
        init()
        return
    for group in opt.optimizer.param_groups:
        for param in group["params"]:
            if param.numel():
                param.grad = torch.zeros_like(param)
    opt.optimizer.step()
    opt.optimizer.zero_grad()


def check_writer() -> None:
    """Raise UnsupportedByBuild when this build's torch_dist writer cannot call this torch's DCP writer.

    0.12.x's FileSystemWriterAsync calls torch's private `filesystem._write_item` without
    `serialization_format`, which torch >= 2.7 requires: every torch_dist save fails in the writer
    ("missing 1 required positional argument"). Upstream adapted the call in core_v0.13.0
    (ADLR/megatron-lm!3243). Read, never called; checked at the save, after the state is built, so a
    cause found while building it (Bug A) still shows.
    """
    from torch.distributed.checkpoint import filesystem

    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:  # no async filesystem writer of its own: it uses torch's, which fits this torch
        return
    param = inspect.signature(filesystem._write_item).parameters.get("serialization_format")
    if param is None or param.default is not inspect.Parameter.empty:
        return
    try:
        source = inspect.getsource(filesystem_async)
    except (OSError, TypeError):
        return
    if "_write_item" in source and "serialization_format" not in source:
        import torch

        raise UnsupportedByBuild(
            "torch_dist save",
            "its FileSystemWriterAsync calls torch.distributed.checkpoint.filesystem._write_item without "
            f"serialization_format, which torch {torch.__version__} requires (adapted upstream in "
            "core_v0.13.0, ADLR/megatron-lm!3243)",
        )


def _numpy_product_shim() -> list[str]:
    """0.12.x on NumPy 2: alias `numpy.product` (removed in NumPy 2.0) to `numpy.prod`; return its name if applied.

    0.12.x's dist_checkpointing calls `np.product` (validation.py `_validate_sharding_for_key_flattened`,
    mapping.py, exchange_utils.py) yet declares `numpy` unpinned, so a build sharing the service's
    NumPy 2 fails every flattened (fully_sharded_model_space) save. The validation runs on global rank
    0 alone, so rank 0 raises while the others enter the save's collectives: a gloo timeout, not an
    error. Upstream pinned numpy<2.0.0 in 0.13.0 (ADLR/megatron-lm!3397) and switched to `np.prod` in
    0.16.0 (#2289). Same values: `product` was a deprecated alias of `prod`.
    """
    import numpy

    if hasattr(numpy, "product"):
        return []
    try:
        from megatron.core.dist_checkpointing import validation
    except ImportError:
        return []

    try:
        calls_it = "np.product(" in inspect.getsource(validation)
    except (OSError, TypeError):
        calls_it = False
    if not calls_it:
        return []
    numpy.product = numpy.prod  # type: ignore[attr-defined]
    return [f"numpy.product: alias of numpy.prod (this build calls it; numpy {numpy.__version__} removed it)"]


def _is_te_fallback(fn: Callable[..., Any]) -> bool:
    # read, never call: the real implementation is collective and must not run outside a step
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return "Invalid Transformer Engine version" in source and source.count("\n") <= 3


@functools.cache
def takes_metadata() -> bool:
    """Whether this build's optimizer.sharded_state_dict takes `metadata` (0.13+)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return "metadata" in inspect.signature(DistributedOptimizer.sharded_state_dict).parameters


def sharding_kwargs(sharding: str) -> dict[str, Any]:
    """How this build's optimizer.sharded_state_dict is told the sharding type.

    0.13+ read it from `metadata={"distrib_optim_sharding_type": ...}`; 0.12.x take a
    `sharding_type=` argument (and reject `metadata`).
    """
    if takes_metadata():
        return {"metadata": {"distrib_optim_sharding_type": sharding}}
    return {"sharding_type": sharding}


def async_save_kwargs() -> dict[str, Any]:
    """How this build's `dist_checkpointing.save` is told to use Megatron's own async writer.

    Main (0.20) added `async_strategy`, defaulting to "nvrx" (nvidia-resiliency-ext, which a plain
    megatron-core install lacks: every async save raised); its in-tree writer is "mcore". Releases
    without the argument have only the in-tree writer.
    """
    from megatron.core import dist_checkpointing

    params = inspect.signature(dist_checkpointing.save).parameters
    return {"async_strategy": "mcore"} if "async_strategy" in params else {}


def layerwise_inner_optimizers(optimizers: list[Any]) -> list[Any]:
    """What this build's LayerWiseDistributedOptimizer takes: the base torch optimizers.

    `get_megatron_optimizer` (bf16 off for the layer-wise path) returns FP32Optimizer wrappers.
    0.16.x/0.17.x unwrap them themselves (`opt.optimizer`) before their own Float16 wrapping; 0.18+
    raise TypeError ("expects base torch optimizers … Do not pre-wrap with Megatron optimizers").
    Unwrapping here is what every release then does inside, so all of them wrap the same torch Adam.
    """
    import torch

    # by what it is, not by where its class lives: a Megatron wrapper holds the torch optimizer in `.optimizer`
    return [
        opt.optimizer if not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer") else opt
        for opt in optimizers
    ]


def _has(module: str, attribute: str | None = None) -> bool:
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    return attribute is None or hasattr(found, attribute)


def capabilities() -> dict[str, Any]:
    """What this build offers, as the harness detected it: recorded per environment and per phase.

    Each entry is found by asking the build (a source literal, a signature, an attribute), with a
    fallback when the place it is asked moved: a build the harness has not seen still runs, and the
    record says what was found, so a new build's failure can be told from a harness that guessed.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return {
        "megatron_core": megatron_version(),
        "sharding_types": list(sharding_types()),
        "dp_reshardable_types": list(dp_reshardable_types()),
        "sharding_argument": "metadata" if takes_metadata() else "sharding_type",
        "sync_save_forks": sync_save_forks(),
        "optimizer_priming": (
            "_init_optimizer_states_with_dummy_values"
            if hasattr(DistributedOptimizer, "_init_optimizer_states_with_dummy_values")
            else "a step on zero grads"
        ),
        "layerwise_optimizer": _has(OPTIMIZER_MODULES["layerwise-adam"]),
        "bucket_param_to_index": _bucket_has_param_to_index(),
        "mark_keep_in_fp32": any(
            _has(m, "mark_keep_in_fp32")
            for m in ("megatron.core.transformer.module", "megatron.core.utils", "megatron.core.transformer.utils")
        ),
    }


def _bucket_has_param_to_index() -> bool:
    try:
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucket
    except ImportError:
        return False
    try:
        return "param_to_index" in inspect.getsource(_ParamAndGradBucket)
    except (OSError, TypeError):
        return False


if __name__ == "__main__":  # `python -m jobs.rank.compat`: what a build's environment records
    import json

    print(json.dumps(capabilities(), sort_keys=True))
