"""The node-count side of e2e_latency.py: the cluster's nodes, keeping jobs on the first K, waiting for quiet."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any


def cluster_nodes() -> dict[str, int]:
    """The nodes of the Slurm that SLURM_CONF names, in name order, with the CPUs each declares."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise SystemExit(f"--nodes: sinfo failed (SLURM_CONF={os.environ.get('SLURM_CONF', '')!r}; "
                         f"source the cluster's env.sh first): {out.stderr.strip()[:300]}")
    nodes: dict[str, int] = {}
    for line in out.stdout.splitlines():
        name, cpus = line.split()
        nodes[name] = int(cpus)
    return dict(sorted(nodes.items()))


def only_first_nodes(names: list[str], k: int, extra_args: str) -> str:
    """PARITY_SLURM_EXTRA_ARGS that keeps the service's jobs on the first k of names (`exclude=` the rest)."""
    rest = names[k:]
    if not rest:
        return extra_args
    # one hostlist expression: the setting's items are comma-separated, so it may hold no comma
    hostlist = subprocess.run(["scontrol", "show", "hostlist", ",".join(rest)], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    if "," in hostlist:
        raise SystemExit(f"--nodes: cannot exclude {hostlist!r} in one PARITY_SLURM_EXTRA_ARGS item")
    return ",".join(filter(None, [extra_args, f"exclude={hostlist}"]))


def wait_jobs_gone(run_folder: Path, timeout: float = 120) -> None:
    """Until no Slurm job of this benchmark's installation is left (a retired worker still exiting holds CPUs)."""
    from service.core.settings import Settings
    from service.executors import pool

    prefix = f"parity-{pool.job_tag(Settings(run_folder=run_folder))}-"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30).stdout
        if not any(n.startswith(prefix) for n in names.split()):
            return
        time.sleep(0.5)
    raise SystemExit(f"jobs of this benchmark ({prefix}*) still queued or running after {timeout:.0f}s")


def wait_pool_idle(run_folder: Path, size: int, timeout: float = 300) -> None:
    """Until `size` pool workers wait idle (the warm-up burst may end before the last one is up)."""
    from service.core.settings import Settings
    from service.executors import pool

    settings = Settings(run_folder=run_folder)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(pool.view(settings, w, None).state == "idle" for w in pool.list_workers(settings)) >= size:
            return
        time.sleep(0.5)
    raise SystemExit(f"fewer than {size} warm workers idle after {timeout:.0f}s")


def print_node_table(summaries: dict[str, Any], node_counts: list[int], modes: list[str]) -> None:
    """Runs per minute by node count, per mode and burst size, each against the first node count's."""
    for mode in modes:
        docs = {k: summaries[f"nodes={k}"][mode] if len(modes) > 1 else summaries[f"nodes={k}"] for k in node_counts}
        first = docs[node_counts[0]]["sizes"]
        for i, row in enumerate(first):
            cells = [f"{k} node(s) {docs[k]['sizes'][i]['runs_per_minute']:.2f} "
                     f"({docs[k]['sizes'][i]['runs_per_minute'] / row['runs_per_minute']:.2f}x)" for k in node_counts]
            print(f"runs/min {mode} N={row['n']}: " + ", ".join(cells), flush=True)
