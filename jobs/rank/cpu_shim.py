"""Runtime shims that let Megatron-Core's DDP + DistributedOptimizer run on a CPU-only torch.

Nothing in site-packages is edited. `install()` is a no-op when CUDA is available, so the same
phase code runs unchanged on GPU nodes. Each shim exists because a named Megatron-Core call site
fails without it (see jobs/README.md, "CPU shims").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_saved: dict[str, Any] = {}
_mode: TorchFunctionMode | None = None


def _is_cuda_device(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # Megatron passes torch.cuda.current_device() ordinals as plain ints.
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaAsCpu(TorchFunctionMode):
    """Route `device="cuda"` to CPU and make `Tensor.type()` report CUDA type names.

    The optimizer dispatches on strings such as 'torch.cuda.BFloat16Tensor', so CPU tensors
    must report those names while the mode is active.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if isinstance(name, str) and name.startswith("torch.") and ".cuda." not in name:
                return "torch.cuda." + name[len("torch.") :]
            return name
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = _CPU
        if func is torch.Tensor.to and len(args) >= 2 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


class _NullStream:
    """A stand-in CUDA stream whose operations do nothing."""

    def wait_event(self, *args: object, **kwargs: object) -> None:
        """Do nothing: CPU work is already ordered."""

    def wait_stream(self, *args: object, **kwargs: object) -> None:
        """Do nothing: CPU work is already ordered."""

    def record_event(self, *args: object, **kwargs: object) -> None:
        """Do nothing: there are no CUDA events on CPU."""

    def synchronize(self) -> None:
        """Do nothing: CPU work is synchronous."""


def _patch(owner: Any, name: str, value: Callable[..., Any] | bool | None) -> None:
    _saved[f"{id(owner)}.{name}"] = (owner, name, getattr(owner, name, None))
    setattr(owner, name, value)


def needed() -> bool:
    """Return True when CUDA is absent and the shims are required."""
    return not torch.cuda.is_available()


def installed() -> bool:
    """Return True while the shims are active."""
    return _mode is not None


def install() -> bool:
    """Install the shims if CUDA is absent; return whether they are active."""
    global _mode
    if _mode is not None or not needed():
        return _mode is not None
    _patch(torch.cuda, "current_device", lambda: _CPU)
    _patch(torch.cuda, "synchronize", lambda *a, **k: None)
    # megatron-core 0.19 calls current_stream() on every grad sync.
    _patch(torch.cuda, "current_stream", lambda *a, **k: _NullStream())
    # Megatron's "model-parallel" CUDA RNG tracker must drive the CPU generator instead.
    _patch(torch.cuda, "get_rng_state", lambda *a, **k: torch.get_rng_state())
    _patch(torch.cuda, "manual_seed", lambda seed: torch.manual_seed(seed))
    import megatron.core.tensor_parallel.random as mrandom

    _patch(mrandom, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    _patch(mrandom, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state))
    import megatron.core.transformer.moe.moe_utils as moe_utils

    # 0.16.x references an undefined `te_general_gemm` when Transformer Engine is missing.
    if not hasattr(moe_utils, "te_general_gemm"):
        _patch(moe_utils, "te_general_gemm", None)
    # Routers (sigmoid scores, the expert bias) call torch.compile'd helpers: on CPU each fresh phase
    # process traced them again, ~1 s a step on the first steps (two thirds of an aux-free check). Both
    # runs of a check run the same eager code, so parity is judged alike; the compiled kernels that
    # matter are the GPU's, which a GPU check runs.
    from torch._dynamo import config as dynamo_config

    _patch(dynamo_config, "disable", True)
    _mode = _CudaAsCpu()
    _mode.__enter__()
    return True


def uninstall() -> None:
    """Undo every shim installed by `install()`."""
    global _mode
    if _mode is None:
        return
    _mode.__exit__(None, None, None)
    _mode = None
    for owner, name, value in reversed(list(_saved.values())):
        if value is None:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _saved.clear()
