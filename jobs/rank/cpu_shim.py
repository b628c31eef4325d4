"""Runtime shims that let Megatron-Core's DDP + DistributedOptimizer run on a CPU-only torch.

Nothing in site-packages is edited. `install()` is a no-op when CUDA is available, so the same
phase code runs unchanged on GPU nodes. Each shim exists because a named Megatron-Core call site
fails without it (see jobs/README.md, "CPU shims").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_CPU = torch.device("cpu")
_saved: dict[str, Any] = {}
_installed = False
_ABSENT = object()


def _is_cuda_device(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # Megatron passes torch.cuda.current_device() ordinals as plain ints.
    return isinstance(device, int) and not isinstance(device, bool)


def _creation_functions() -> list[str]:
    """torch's creation functions that take `device=` (each one's docstring documents the parameter), read
    at install time, so a torch that adds one is covered too."""

    def documents_device(obj: object) -> bool:
        doc = getattr(obj, "__doc__", None)
        return isinstance(doc, str) and "device (" in doc

    names = (name for name in dir(torch) if not name.startswith("_") and name != "set_default_device")
    return [name for name in names
            if callable(obj := getattr(torch, name, None)) and not isinstance(obj, type) and documents_device(obj)]


_NEW_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")


def _cpu_device_kwarg(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with a CUDA `device=` replaced by the CPU (the caller's dict is its own: **kwargs)."""
    if "device" in kwargs and _is_cuda_device(kwargs["device"]):
        kwargs["device"] = _CPU
    return kwargs


def _device_to_cpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a CUDA `device=` argument routed to the CPU."""

    @functools.wraps(fn)
    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **_cpu_device_kwarg(kwargs))

    return on_cpu


def _tensor_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.to` with a CUDA device (positional or `device=`) routed to the CPU."""

    @functools.wraps(original)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args and _is_cuda_device(args[0]):
            args = (_CPU, *args[1:])
        return original(self, *args, **_cpu_device_kwarg(kwargs))

    return to


def _tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.type()` reporting CUDA type names: the optimizer dispatches on strings such as
    'torch.cuda.BFloat16Tensor', so CPU tensors must report those names while the shims are active."""

    @functools.wraps(original)
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a conversion: a CUDA type name means the same dtype on the CPU
            if args and isinstance(args[0], str) and ".cuda." in args[0]:
                args = (args[0].replace(".cuda.", ".", 1), *args[1:])
            return original(self, *args, **kwargs)
        name = original(self)
        if isinstance(name, str) and name.startswith("torch.") and ".cuda." not in name:
            return "torch.cuda." + name[len("torch.") :]
        return name

    return type_


def _tensor_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`Tensor.cuda()` on a CPU host: the tensor itself."""
    return self


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


def _patch(owner: Any, name: str, value: Callable[..., Any] | bool | str | None) -> None:
    # a class's own attribute only (an inherited method, e.g. Tensor.to from TensorBase, is removed on undo)
    held = vars(owner).get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name, _ABSENT)
    _saved[f"{id(owner)}.{name}"] = (owner, name, held)
    setattr(owner, name, value)


def needed() -> bool:
    """Return True when CUDA is absent and the shims are required."""
    return not torch.cuda.is_available()


def installed() -> bool:
    """Return True while the shims are active."""
    return _installed


def install() -> bool:
    """Install the shims if CUDA is absent; return whether they are active."""
    global _installed
    if _installed or not needed():
        return _installed
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
    # Disabled, a compiled function still hands its frame to dynamo's callback, whose first call builds
    # dynamo's rule map (0.12 s a phase, rebuilt in each one: init_process_group clears it); the
    # "force_eager" stance (torch >= 2.6) runs it as plain Python with no callback at all
    from torch._dynamo import eval_frame

    stance = getattr(eval_frame, "_stance", None)
    if stance is not None and hasattr(stance, "stance"):
        _patch(stance, "stance", "force_eager")
    # Plain attribute patches, not a TorchFunctionMode: a mode runs Python on every torch call of a step
    # (about 3,000 a step for a 2-layer MoE), where only creation, `.to`, `.cuda` and `.type` need it.
    for name in _creation_functions():
        _patch(torch, name, _device_to_cpu(getattr(torch, name)))
    for name in _NEW_METHODS:
        _patch(torch.Tensor, name, _device_to_cpu(getattr(torch.Tensor, name)))
    _patch(torch.Tensor, "to", _tensor_to(torch.Tensor.to))
    _patch(torch.Tensor, "type", _tensor_type(torch.Tensor.type))
    _patch(torch.Tensor, "cuda", _tensor_cuda)
    _installed = True
    return True


def uninstall() -> None:
    """Undo every shim installed by `install()`."""
    global _installed
    if not _installed:
        return
    _installed = False
    for owner, name, value in reversed(list(_saved.values())):
        if value is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _saved.clear()
