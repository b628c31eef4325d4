"""How many GPUs a `device: cuda` check can have, found without importing torch; the refusal at submit.

A cuda check asks for one GPU per rank on each node (jobs/protocol.py `Payload.gpus_per_node`). Where
there are fewer, the run could only fail or wait forever, so POST /runs refuses it (422) naming what it
needs and what there is. What there is: PARITY_GPUS when set (a declaration: 0 says the installation
is CPU-only), else for the local executor the NVIDIA driver's list of this host's GPUs
(/proc/driver/nvidia/gpus, or `nvidia-smi -L`), and for Slurm the most GPUs one node of the partition
offers (`sinfo`'s gres column, `gpu[:type]:N`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from jobs.spec import RunSpec
from service.core.errors import InvalidSpec
from service.core.settings import Settings

DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def host_gpus(driver: Path = DRIVER_GPUS) -> int:
    """The NVIDIA GPUs on this host (0 where there is no driver)."""
    if driver.is_dir():
        found = sum(1 for p in driver.iterdir() if p.is_dir())
        if found:
            return found
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def gres_gpus(gres: str) -> int:
    """GPUs in one node's gres string ('gpu:h200:8(S:0-1)', 'gpu:4,shard:8', '(null)': 0)."""
    return sum(int(n) for n in _GRES_GPU.findall(gres.strip()))


def partition_gpus(partition: str | None) -> int:
    """The most GPUs one node of the Slurm partition (the default one when None) offers."""
    if shutil.which("sinfo") is None:
        return 0
    command = ["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return max((gres_gpus(line) for line in out.stdout.splitlines()), default=0)


def available(settings: Settings, executor: str) -> tuple[int, str]:
    """(GPUs per node a job of this executor can have, where that number comes from)."""
    if settings.gpus is not None:
        return settings.gpus, "PARITY_GPUS"
    if executor == "slurm":
        partition = settings.slurm_partition
        where = f"Slurm partition {partition!r}" if partition else "the default Slurm partition"
        return partition_gpus(settings.slurm_partition), f"a node of {where}"
    return host_gpus(), "this host (the local executor)"


def needed_per_node(spec: RunSpec) -> int:
    """GPUs each node of the run's largest job needs: one per rank on it (0 for a cpu spec)."""
    ranks = max(spec.phase_world_size(p) for p in ("train_and_save", "resume"))
    return spec.gpus_per_task * (ranks // spec.nodes)


class Budget:
    """The GPUs one request's cuda checks may have: looked up at its first cuda check and kept for the rest
    (a suite or sweep of many checks asks sinfo or the driver once); a cpu spec costs nothing."""

    def __init__(self, settings: Settings, executor: str | None = None) -> None:
        self.settings, self.executor = settings, executor
        self._have: tuple[int, str] | None = None

    def check(self, spec: RunSpec) -> None:
        """Refuse (InvalidSpec, a 422 on `spec.device`) a cuda check the executor (default: the one the
        scheduler picks) has too few GPUs for."""
        needed = needed_per_node(spec)
        if not needed:
            return
        if self._have is None:
            if self.executor is None:
                from service.executors.selection import pick_executor

                self.executor = pick_executor(self.settings)
            self._have = available(self.settings, self.executor)
        have, where = self._have
        if have < needed:
            raise InvalidSpec(
                f"device: cuda needs {needed} GPU(s) per node (one per rank: {needed} rank(s) on each of "
                f"{spec.nodes} node(s)) and {where} has {have}; allowed: cpu, or at most {have} rank(s) per "
                "node on cuda", field="spec.device")


def check(spec: RunSpec, settings: Settings, executor: str | None = None) -> None:
    """Budget(settings, executor).check(spec), for one spec."""
    Budget(settings, executor).check(spec)
