"""Tiny job payloads and phase documents for scheduler tests that need real jobs but not Megatron.

The payloads run as real submitit jobs (local processes or Slurm); they import nothing heavy.
"""

from __future__ import annotations

import math
import time
from typing import Any

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}
LOSS = {1: 7.0, 2: 6.9, 3: math.nan, 4: 6.7}


def _state(step: float) -> dict[str, Any]:
    fp = {"numel": 4, "sum": 1.0, "abs_sum": 1.0, "sha1": "h1"}
    return {"w": {"param": fp, "exp_avg": fp, "exp_avg_sq": fp, "step": step}}


def phase_doc(phase: str, *, grad_norm: Any = 1.0, **info: Any) -> dict[str, Any]:
    """A phase document as a rank returns it: NaN loss at step 3 (on both sides), fingerprints that agree."""
    steps = range(1, 5) if phase == "train_and_save" else range(3, 5)
    probes = (
        {"fingerprints_at_save": {"owned": [_state(2.0)], "slots": [_state(2.0)]}}
        if phase == "train_and_save" else {"fingerprints_after_load": {"owned": [_state(2.0)]}}
    )
    return {
        "status": "ok", "phase": phase, "rank": 0, "spec": SPEC, "error": None, "info": dict(info),
        "probes": probes, "workarounds": {},
        "steps": [{"step": s, "loss": LOSS[s], "lr": 1e-3, "grad_norm": grad_norm, "num_zeros": None,
                   "wall_s": math.inf if s == 4 else 0.1} for s in steps],
    }


def return_document(doc: dict[str, Any]) -> dict[str, Any]:
    """Job payload: return the given document."""
    return doc


def sleep_forever(marker: str) -> None:
    """Job payload: note this process's pid in `marker`, then sleep until killed."""
    import os

    with open(marker, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    while True:
        time.sleep(1)
