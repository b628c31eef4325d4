"""One snapshot of everything a resume must restore, as exact byte fingerprints per named item.

Sections: `model` (weights and buffers as the model holds them), `main` (the optimizer's FP32
main params), `moments` (every optimizer state tensor, `name/key`), `steps` (per-param Adam step),
`groups` (every param group's scalars, also `step` where a fused optimizer keeps it there),
`scheduler`, `iteration`, `rng` (torch CPU, CUDA when present, Megatron's tracker), `scaler` (the
fp16 dynamic loss scaler; empty under bf16) and `nonpersistent` (buffers Megatron does not save:
recorded, never compared). Values are
strings so that equality is exact and the document carries no floats that JSON cannot hold.
`jobs/verdict/state_diff.py` turns two snapshots into named signatures.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from jobs.rank import rng
from jobs.rank.probes.fingerprints import owned_pairs


def fingerprint(t: torch.Tensor) -> str:
    """Return `dtype[shape]:sha256` of a tensor's exact bytes (first 16 hex digits)."""
    flat = t.detach().contiguous().cpu().reshape(-1)
    digest = hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}:{digest}"


def scalar(value: Any) -> str:
    """Return an exact, comparable text form of a param-group or scheduler value."""
    if isinstance(value, torch.Tensor):
        return fingerprint(value) if value.numel() != 1 else repr(float(value))
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(scalar(v) for v in value) + ")"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    return type(value).__name__  # objects (configs) compare by kind only


def param_groups(optimizer: Any) -> dict[str, str]:
    """Return every param group's entries except `params`, keyed `o{optimizer}.g{group}.{key}`."""
    out = {}
    for i, opt in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        for g, group in enumerate(opt.optimizer.param_groups):
            out[f"o{i}.g{g}.local_params"] = repr(len(group["params"]))
            for key, value in group.items():
                if key != "params":
                    out[f"o{i}.g{g}.{key}"] = scalar(value)
    return out


def _optimizer_sections(optimizer: Any, name_of: dict[Any, str]) -> dict[str, dict[str, str]]:
    main: dict[str, str] = {}
    moments: dict[str, str] = {}
    steps: dict[str, str] = {}
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        for model_param, main_param in owned_pairs(opt):
            name = name_of.get(model_param, "?")
            main[name] = fingerprint(main_param)
            for key, value in sorted(inner.state.get(main_param, {}).items()):
                if key == "step":
                    steps[name] = scalar(value)
                elif isinstance(value, torch.Tensor):
                    moments[f"{name}/{key}"] = fingerprint(value)
    return {"main": main, "moments": moments, "steps": steps}


def buffers(module: torch.nn.Module) -> tuple[dict[str, str], dict[str, str]]:
    """Fingerprint the module's buffers: (persistent, non-persistent), keyed `buffer:{name}`.

    Persistent buffers (the routers' `expert_bias`) are checkpointed state a load must restore;
    non-persistent ones (`local_tokens_per_expert`) are not saved by Megatron and are re-derived
    by the step (finalize_model_grads zeroes the counters), so they are recorded but not compared.
    """
    persistent: dict[str, str] = {}
    transient: dict[str, str] = {}
    for mod_name, mod in module.named_modules():
        for name, buf in mod._buffers.items():
            if buf is None:
                continue
            key = f"buffer:{mod_name}.{name}" if mod_name else f"buffer:{name}"
            target = transient if name in mod._non_persistent_buffers_set else persistent
            target[key] = fingerprint(buf)
    return persistent, transient


def loss_scaler(optimizer: Any) -> dict[str, str]:
    """The fp16 dynamic loss scaler of every optimizer in the chain ({} without one): scale and trackers."""
    out: dict[str, str] = {}
    for i, opt in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        scaler = getattr(opt, "grad_scaler", None)
        if scaler is None:
            continue
        for key, value in sorted(scaler.state_dict().items()):
            out[f"o{i}.{key}"] = scalar(value)
    return out


def _loop_state(tr: Any) -> dict[str, str]:
    """The training loop's state beside the iteration: the rerun state machine, where the config runs one."""
    if not tr.config.rerun_state_machine:
        return {}
    from jobs.rank import rerun

    return rerun.fields()


def scheduler_section(tr: Any) -> dict[str, str]:
    """The LR scheduler's checkpointed state, as snapshot text."""
    return {k: scalar(v) for k, v in sorted(tr.scheduler.state_dict().items())}


def iteration_section(tr: Any) -> dict[str, str]:
    """The iteration and the training loop's state beside it (the rerun state machine), as snapshot text."""
    return {"iteration": repr(int(tr.iteration)), **_loop_state(tr)}


def snapshot(tr: Any) -> dict[str, Any]:
    """Fingerprint the trainee's whole resumable state on this rank."""
    module = tr.ddp.module
    model = {n: fingerprint(p) for n, p in module.named_parameters()}
    persistent, transient = buffers(module)
    model.update(persistent)
    return {
        "model": model,
        **_optimizer_sections(tr.optimizer, tr.name_of),
        "groups": param_groups(tr.optimizer),
        "scheduler": scheduler_section(tr),
        "iteration": iteration_section(tr),
        "rng": {k: fingerprint(v) for k, v in rng.capture().items()},
        "scaler": loss_scaler(tr.optimizer),
        "nonpersistent": transient,
    }
