"""A "regressed Megatron-Core build" for the on-call test: the stock build with a resume bug injected
at import time (no site-packages edits). Checkpoint loading hands back every floating-point tensor
scaled by 1.001, so the resumed run can no longer match the uninterrupted one."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

TARGET = "megatron.core.dist_checkpointing"


def _scale(node: Any) -> None:
    import torch

    if isinstance(node, dict):
        for value in node.values():
            _scale(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _scale(value)
    elif isinstance(node, torch.Tensor) and node.is_floating_point():
        with torch.no_grad():
            node.mul_(1.001)


def _patch(module: Any) -> None:
    original = module.load

    def load(*args: Any, **kwargs: Any) -> Any:
        loaded = original(*args, **kwargs)
        _scale({k: v for k, v in dict(loaded).items() if k in ("model", "optimizer")})
        return loaded

    module.load = load


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched_exec(module: Any) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = patched_exec  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _Hook())
