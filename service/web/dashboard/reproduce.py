"""The exact commands that reproduce a run: locally (`parity run-local`) and on Slurm (`parity submit`)."""

from __future__ import annotations

import shlex
from typing import Any


def _spec_args(spec: dict[str, Any]) -> list[str]:
    # Every field explicitly, so the command still reproduces the run if a default changes later.
    args = ["--config", str(spec["config"]), "--dp", str(spec["dp"]), "--steps", str(spec["steps"]),
            "--save-step", str(spec["save_step"])]
    for key in ("sharding", "seed", "tolerance"):
        if spec.get(key) is not None:
            args += [f"--{key}", str(spec[key])]
    for key in ("tp", "pp", "ep"):  # parallel layout: stored only when not 1
        if spec.get(key) not in (None, 1):
            args += [f"--{key}", str(spec[key])]
    for name in spec.get("workarounds") or []:
        args += ["--workaround", str(name)]
    if spec.get("resume_dp") is not None:
        args += ["--resume-dp", str(spec["resume_dp"])]
    return args


def local_command(spec: dict[str, Any]) -> str:
    """`parity run-local …` for this spec, shell-quoted."""
    return shlex.join(["parity", "run-local", *_spec_args(spec)])


def submit_command(spec: dict[str, Any], *, environment: str, labels: dict[str, str], base_url: str) -> str:
    """`parity submit … --wait` against this service, shell-quoted (the token comes from PARITY_TOKEN)."""
    args = ["parity", "submit", *_spec_args(spec), "--environment", environment]
    for key, value in sorted(labels.items()):
        args += ["--label", f"{key}={value}"]
    args += ["--url", base_url, "--wait"]
    return shlex.join(args)
