"""Pipeline-parallel steps (pp > 1) on CPU: Megatron-Core's 1F1B schedule over gloo send/recv.

Each stage builds only its layers (GPTModel pre_process on the first stage, post_process on the
last); the schedule moves activations forward and their grads back between stages, and only the
last stage sees the loss. Every stage generates the same batch (keyed by the data-parallel rank),
so the first stage reads the tokens and the last the labels of one and the same batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def forward_backward(
    ddp: Any, cfg: Any, forward_model: Callable[[Any, torch.Generator], torch.Tensor], gen_for: Callable[[int], Any]
) -> Callable[[int], tuple[torch.Tensor, float]]:
    """A step's forward + backward through the pipeline; -> (loss, 1.0) on the last stage, (0, 0.0) elsewhere."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def run(step: int) -> tuple[torch.Tensor, float]:
        gen = gen_for(step)

        def forward_step(_data_iterator: Any, model: Any) -> tuple[torch.Tensor, Callable[..., Any]]:
            output = forward_model(model, gen)

            def loss_func(out: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
                loss = out.float().mean()
                return loss, {"loss": loss.detach().clone()}

            return output, loss_func

        stored = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([None]),
            model=[ddp],
            num_microbatches=1,
            seq_length=cfg.seq_length,
            micro_batch_size=cfg.micro_batch_size,
            forward_only=False,
        )
        if parallel_state.is_pipeline_last_stage():
            return stored[0]["loss"], 1.0
        from jobs.rank.device import current

        # all-reduced with the loss: on the rank's device (NCCL reduces GPU tensors only)
        return torch.zeros((), dtype=torch.float32, device=current()), 0.0

    return run
