"""Model pieces for tensor-parallel layouts on CPU (no Transformer Engine, no Apex).

Megatron-Core's MoELayer refuses to train with TP > 1 unless sequence parallelism is on, and the
local (no-TE) spec's `WrappedTorchNorm` asserts sequence parallelism off. TE's and Apex's norms
only add what sequence parallelism needs: the norm's weights are replicated over the TP group
but see 1/tp of the sequence each, so they carry `sequence_parallel = True` and
`finalize_model_grads` sums their grads over the TP group. `SequenceParallelTorchNorm` is
torch's LayerNorm with exactly that, and `gpt_block_spec` puts it where the local spec has
`WrappedTorchNorm` (every layer's norms and the final one). TP 1 keeps the local spec untouched.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


class SequenceParallelTorchNorm(torch.nn.LayerNorm):
    """torch LayerNorm whose params are marked for the TP-group grad sum under sequence parallelism."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        if getattr(config, "normalization", "LayerNorm") != "LayerNorm":
            raise ValueError(f"normalization {config.normalization!r}: only LayerNorm is wired for TP > 1")
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]


def _swap_norms(submodules: Any, norm: type) -> Any:
    """A copy of a layer's submodules with every WrappedTorchNorm replaced by `norm`."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    changes = {
        f.name: norm
        for f in dataclasses.fields(submodules)
        if getattr(submodules, f.name) is WrappedTorchNorm
    }
    return dataclasses.replace(submodules, **changes)


def gpt_block_spec(num_experts: int | None, num_layers: int) -> Any:
    """The local GPT layer spec as a block spec whose norms work under sequence parallelism."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer = get_gpt_layer_local_spec(num_experts=num_experts)
    layer = dataclasses.replace(layer, submodules=_swap_norms(layer.submodules, SequenceParallelTorchNorm))
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=SequenceParallelTorchNorm)
