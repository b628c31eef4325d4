"""Run one warm-pool order (an attempt: train_and_save, then resume) under a CUDA-initialisation tripwire.

Used by tests/jobs/test_fork_safety_megatron.py in a fresh interpreter: `python fork_safety_run.py OUT_DIR`.
The tripwire replaces every torch.cuda entry point that initialises CUDA (or, on a GPU host, poisons
fork: device_count/is_available call cudaGetDeviceCount). In a process that forks phase children (the
pool task, which pre-imports everything, and the attempt child, which pre-imports again and forks each
phase) a call raises and is written to OUT_DIR/tripped.jsonl; a phase child (it enters
run_rank_phase) disarms it and calls through, as CUDA may be initialised there after the fork.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch

OUT = Path(sys.argv[1])
ARMED = {"on": True}
CUDA_ENTRY_POINTS = ("init", "_lazy_init", "is_available", "device_count", "set_device", "current_device",
                     "get_device_properties", "get_device_capability", "get_device_name", "get_rng_state",
                     "synchronize", "current_stream", "mem_get_info", "is_bf16_supported", "get_arch_list",
                     "memory_allocated", "max_memory_allocated", "Stream", "Event")


class CudaInitInForkingParent(RuntimeError):
    """CUDA was touched in a process that forks phase children."""


def _trip(name: str, real):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        if ARMED["on"]:
            with (OUT / "tripped.jsonl").open("a") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "call": f"torch.cuda.{name}",
                                     "stack": traceback.format_stack(limit=12)[:-1]}) + "\n")
            raise CudaInitInForkingParent(f"torch.cuda.{name}() in a process that forks phase children")
        with (OUT / "child_calls.jsonl").open("a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "call": f"torch.cuda.{name}"}) + "\n")
        return real(*args, **kwargs)

    return wrapper


for _name in CUDA_ENTRY_POINTS:
    setattr(torch.cuda, _name, _trip(_name, getattr(torch.cuda, _name)))
if hasattr(torch._C, "_cuda_getDeviceCount"):
    torch._C._cuda_getDeviceCount = _trip("_C._cuda_getDeviceCount", torch._C._cuda_getDeviceCount)
if hasattr(torch._C, "_cuda_init"):
    torch._C._cuda_init = _trip("_C._cuda_init", torch._C._cuda_init)

# the tripwire itself works: a call here, in the pool task, raises
try:
    torch.cuda.is_available()
    raise SystemExit("the tripwire did not fire")
except CudaInitInForkingParent:
    (OUT / "tripped.jsonl").unlink()

from jobs.launch import pool_worker  # noqa: E402
from jobs.pool_folder import PoolFolder  # noqa: E402
from jobs.rank import attempt  # noqa: E402
from jobs.rank.dist import free_port  # noqa: E402

_phase = attempt.run_rank_phase


def _phase_child(*args, **kwargs):  # type: ignore[no-untyped-def]
    ARMED["on"] = False  # this process runs a phase: CUDA belongs to it
    return _phase(*args, **kwargs)


attempt.run_rank_phase = _phase_child  # type: ignore[assignment]
pool_worker.ENTRIES["phase"] = _phase_child
spec = json.loads(sys.argv[2])
runs = OUT / "run"
pool = PoolFolder(OUT / "pool")
pool.folder.mkdir(parents=True)
beat = pool_worker._Beat(pool, 0)
info = pool_worker._preload_beating(beat)  # the warm task's imports, under the tripwire
order = {"id": "o1", "kind": "attempt", "entry": "attempt", "logs": [], "env": {},
         "args": [spec, str(runs), ["train_and_save", "resume"], [free_port(), free_port()],
                  {"train_and_save": 1, "resume": 1}, 1]}
code = pool_worker._run_order(pool, 0, order, beat)
(OUT / "summary.json").write_text(json.dumps({"preload": info, "exit": code}))
