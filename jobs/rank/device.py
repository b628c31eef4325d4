"""The device a rank runs on, from its spec's `device`: bound once per phase process, after the fork.

`resolve` is plain data (no torch): which torch device and which process-group backend a rank of a
spec uses. `prepare_environment` runs before anything in the process touches CUDA: a `cpu` rank
hides every GPU (CUDA_VISIBLE_DEVICES="", so a CPU check on a GPU host stays on CPU, with gloo and
the CPU shims), a `cuda` rank sets the deterministic knobs that are read when CUDA/cuBLAS/NCCL
initialise. `bind` then binds LOCAL_RANK's GPU and turns on torch's deterministic algorithms.
`current()` is the device every tensor the harness makes goes to (data, masks, loss scales,
probes' scratch); state the probes fingerprint or gather is copied to the CPU first.

Fork safety: nothing here runs in the pre-importing parent (`jobs/rank/attempt.preload`) or in a
warm-pool task; CUDA is first initialised by `bind`, in the phase child
(tests/jobs/test_fork_safety_megatron.py makes any CUDA initialisation in the parent raise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from jobs.spec import DEVICES

# Read when cuBLAS / NCCL / Transformer Engine initialise, so set before the first CUDA call.
# CUBLAS_WORKSPACE_CONFIG: required by torch.use_deterministic_algorithms for cuBLAS GEMMs;
# NCCL_ALGO: one fixed all-reduce algorithm (Megatron-LM's --deterministic-mode asks for one);
# NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: Transformer Engine's deterministic kernels (dense-fp8-te, grouped GEMM).
DETERMINISTIC_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}


@dataclass(frozen=True)
class Binding:
    """Where one rank runs: the torch device string, the process-group backend, the spec's device kind."""

    device: str
    backend: str
    kind: str


def local_rank() -> int:
    """This rank's index on its node (submitit / torchrun export LOCAL_RANK)."""
    for key in ("LOCAL_RANK", "SUBMITIT_LOCAL_LOCALID", "SLURM_LOCALID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def resolve(kind: str, rank_on_node: int = 0) -> Binding:
    """The binding of a rank of a spec with `device: kind` (no torch, no CUDA call)."""
    if kind not in DEVICES:
        raise ValueError(f"device: unknown device {kind!r}; allowed: {', '.join(DEVICES)}")
    if kind == "cuda":
        return Binding(f"cuda:{rank_on_node}", "nccl", "cuda")
    return Binding("cpu", "gloo", "cpu")


def prepare_environment(kind: str, environ: Any = None) -> dict[str, str]:
    """Set what must be set before CUDA initialises in this process; return what was set."""
    env = os.environ if environ is None else environ
    if kind == "cpu":
        changes = {"CUDA_VISIBLE_DEVICES": ""}  # a CPU check never sees a GPU, even on a GPU host
    else:
        changes = {k: v for k, v in DETERMINISTIC_ENV.items() if k not in env}
    env.update(changes)
    return changes


_bound: Binding = resolve("cpu")


def bind(kind: str) -> Binding:
    """Bind this rank to its device: LOCAL_RANK's GPU and deterministic algorithms for cuda, else the CPU.

    Raises UnsupportedByBuild when a cuda rank sees no CUDA device (this torch or this node has none).
    """
    global _bound
    import torch

    binding = resolve(kind, local_rank())
    if kind == "cuda":
        from jobs.rank.compat import UnsupportedByBuild

        prepare_environment(kind)
        if not torch.cuda.is_available():
            raise UnsupportedByBuild("device 'cuda'", "this rank sees no CUDA device (torch.cuda.is_available() is "
                                     f"False; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        visible = torch.cuda.device_count()
        index = local_rank()
        if index >= visible:
            raise UnsupportedByBuild("device 'cuda'", f"local rank {index} needs GPU {index} and this rank sees "
                                     f"{visible}: the job was given fewer GPUs than ranks")
        torch.cuda.set_device(index)
        # warn_only: an op with no deterministic CUDA kernel warns (in the rank's log) instead of failing the
        # check; what is then not bit-exact is judged by the GPU noise measured for it (jobs/tolerance.py)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    _bound = binding
    return binding


def current() -> Any:
    """The torch device this rank's tensors go to (the CPU until `bind`)."""
    import torch

    return torch.device(_bound.device)


def is_cuda() -> bool:
    """Whether this rank is bound to a GPU."""
    return _bound.kind == "cuda"


def reset() -> None:
    """Forget the binding (a phase process ends; tests)."""
    global _bound
    _bound = resolve("cpu")
