"""A local job's caps: pids.max and memory.max on its cgroup (PARITY_JOB_PIDS_MAX, PARITY_JOB_MEMORY_MAX).

Without them a job could fork until the node has no pids left, or take every byte of memory (its tmpfs
/dev/shm included), and every other job on the node, and the service, would fail with it. Where the job's
cgroup v2 (job_cgroup.py) has the `pids` and `memory` controllers, the caps are set there; a host that
still binds those controllers to cgroup v1 hierarchies (a hybrid layout, as on this project's test
machines) gets them in a v1 cgroup of the job's own in each, below the scheduler's own v1 cgroup (so the
scheduler's own limits still hold around its jobs). `where` says which, or why neither can be had.
"""

from __future__ import annotations

import logging
from pathlib import Path

from service.executors.job_cgroup import JOBS_FOLDER, mounts

log = logging.getLogger(__name__)
CONTROLLERS = ("pids", "memory")
# the v1 file of each cap (v2: pids.max, memory.max)
V1_FILES = {"pids": "pids.max", "memory": "memory.limit_in_bytes"}


class LimitsError(RuntimeError):
    """The caps cannot be set on this host: neither a cgroup v2 with the controllers nor a writable v1 one."""


def _v1_mounts() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for parts in mounts():
        if len(parts) > 3 and parts[2] == "cgroup":
            for name in CONTROLLERS:
                if name in parts[3].split(","):
                    out.setdefault(name, Path(parts[1]))
    return out


def _v1_own(controller: str) -> str:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path.strip()
    except (OSError, ValueError):
        pass
    return "/"


def _v2_ready(root: Path) -> bool:
    """Whether job cgroups under `root` (v2) can carry both caps (enables them in root's subtree_control)."""
    try:
        available = (root / "cgroup.controllers").read_text().split()
        if not all(c in available for c in CONTROLLERS):
            return False
        enabled = (root / "cgroup.subtree_control").read_text().split()
        missing = [c for c in CONTROLLERS if c not in enabled]
        if missing:
            (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))
        return True
    except OSError:
        return False


def v1_cgroups(name: str) -> dict[str, Path]:
    """The job's v1 cgroup per controller (made by `apply`), empty where the caps live in cgroup v2."""
    return {c: mount / _v1_own(c).lstrip("/") / JOBS_FOLDER / name for c, mount in _v1_mounts().items()}


def apply(v2_cgroup: Path | None, *, pids_max: str, memory_max: int | None) -> list[Path]:
    """Set the caps for the job whose v2 cgroup is `v2_cgroup` (made already); -> the v1 cgroups it must
    also enter (their cgroup.procs). LimitsError naming what is missing when neither layout can take them."""
    memory = "max" if memory_max is None else str(memory_max)
    if v2_cgroup is not None and _v2_ready(v2_cgroup.parent):
        (v2_cgroup / "pids.max").write_text(pids_max)
        (v2_cgroup / "memory.max").write_text(memory)
        return []
    groups = v1_cgroups(v2_cgroup.name if v2_cgroup is not None else "job")
    missing = [c for c in CONTROLLERS if c not in groups]
    if missing:
        raise LimitsError(f"no cgroup controller {', '.join(missing)} for a local job's caps (PARITY_JOB_PIDS_MAX, "
                          "PARITY_JOB_MEMORY_MAX): neither in the job's cgroup v2 nor a v1 hierarchy")
    values = {"pids": pids_max, "memory": "-1" if memory == "max" else memory}
    try:
        for controller, folder in groups.items():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / V1_FILES[controller]).write_text(values[controller])
    except OSError as exc:
        raise LimitsError(f"cannot set a local job's caps in {folder}: {exc}") from None
    return [folder / "cgroup.procs" for folder in groups.values()]


def remove(name: str) -> None:
    """Remove the job's v1 cgroups once its processes are gone (its v2 cgroup is job_cgroup.kill's)."""
    for folder in v1_cgroups(name).values():
        try:
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:  # still busy: the processes were killed through the v2 cgroup a moment ago
            log.warning("job cgroup %s not removed: %s", folder, exc)
