"""A virtual pipeline's model chunks seen as one model (the trainee's `ddp`), so every probe reads them all.

With a virtual pipeline each pipeline stage holds several model chunks, each its own Float16Module inside
its own DistributedDataParallel (only the first bucketed), all in one optimizer, and Megatron-LM checkpoints
them as `model0`, `model1`, ... The probes, the state snapshot and the checkpoint code take one `ddp`
with a `module`: `ChunkedDDP` is that view, naming each chunk's params `model<i>.<name>`. The schedule
itself gets the real chunks (`chunks`), as Megatron-LM hands it its model list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ChunkedModule(torch.nn.Module):
    """The chunks' Float16Modules as children `model0`, `model1`, ...: their checkpoint's model sections."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        super().__init__()
        for i, module in enumerate(modules):
            self.add_module(f"model{i}", module)

    def sharded_state_dict(self, prefix: str = "", *args: Any, **kwargs: Any) -> dict[str, Any]:
        """{"model<i>": chunk i's sharded state dict}, as Megatron-LM's trainer builds it."""
        return {name: m.sharded_state_dict(prefix, *args, **kwargs)  # type: ignore[operator]
                for name, m in self.named_children()}

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load each chunk from its own section."""
        for name, module in self.named_children():
            module.load_state_dict(state_dict[name], strict=strict)


class ChunkedDDP:
    """The DDP-wrapped chunks of one rank, with what the trainee asks of a DDP model, applied to each."""

    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = chunks
        self.module = ChunkedModule([c.module for c in chunks])
        self.config = chunks[0].config
        self.ddp_config = chunks[0].ddp_config
        self.use_forward_hook = any(getattr(c, "use_forward_hook", False) for c in chunks)

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Every chunk's params, named `model<i>.<its own name>`."""
        for i, chunk in enumerate(self.chunks):
            for name, p in chunk.named_parameters():
                yield f"model{i}.{name}", p

    @property
    def buffers(self) -> list[Any]:
        """Every chunk's dense grad buffers, in chunk order."""
        return [b for c in self.chunks for b in c.buffers]

    @property
    def expert_parallel_buffers(self) -> list[Any]:
        """Every chunk's expert grad buffers, in chunk order."""
        return [b for c in self.chunks for b in getattr(c, "expert_parallel_buffers", [])]

    @property
    def remove_forward_pre_hook_handles(self) -> bool:
        """Whether any chunk's deferred-gather pre-hooks are on."""
        return any(c.remove_forward_pre_hook_handles for c in self.chunks)

    def zero_grad_buffer(self) -> None:
        """Zero every chunk's grad buffers."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()

    def finish_grad_sync(self) -> None:
        """Finish every chunk's grad reduction."""
        for chunk in self.chunks:
            chunk.finish_grad_sync()

    def disable_forward_pre_hook(self, param_sync: bool = True) -> None:
        """Turn every chunk's deferred param gather off (gathering now, or not)."""
        for chunk in self.chunks:
            if chunk.remove_forward_pre_hook_handles:
                chunk.disable_forward_pre_hook(param_sync=param_sync)

    def enable_forward_pre_hook(self) -> None:
        """Turn every chunk's deferred param gather back on."""
        for chunk in self.chunks:
            if not chunk.remove_forward_pre_hook_handles:
                chunk.enable_forward_pre_hook()
