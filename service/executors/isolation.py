"""What a local job is promised, checked before it starts: its cgroup, its caps, its own mounts and network.

Each isolation (settings.ISOLATIONS) is promised whenever the scheduler is root, the only way a host can
give it. One that this host cannot set up stops every local job from starting (IsolationMissing, naming
it and what would waive it), instead of the job silently running with less (the review's fail-open
`/tmp`); PARITY_JOB_ISOLATION_WAIVE lets a job go without one, logged at every job it concerns.
The checks run the real thing once per process (job_sandbox.py with only that step, then `true`).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from service.core.settings import ISOLATIONS, Settings
from service.executors import job_cgroup

log = logging.getLogger(__name__)
SANDBOX = Path(__file__).with_name("job_sandbox.py")


class IsolationMissing(RuntimeError):
    """A promised isolation cannot be set up on this host: no job starts until it can, or it is waived."""


def sandbox_command(spec: dict[str, object], command: list[str]) -> list[str]:
    """`command` run inside the sandbox `spec` describes (job_sandbox.py, as root; -I: no path a job wrote)."""
    return [sys.executable, "-I", str(SANDBOX), json.dumps(spec), "--", *command]


@lru_cache(maxsize=4)
def _probe(step: str) -> str | None:
    spec: dict[str, object] = {"network": True} if step == "network" else {
        "mounts": True, "folders": {}, "shm_size": 1 << 20}
    try:
        done = subprocess.run(sandbox_command(spec, ["true"]), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def missing(settings: Settings) -> dict[str, str]:
    """{isolation: why it cannot be had here} for each this host cannot give a local job (waived or not)."""
    out: dict[str, str] = {}
    try:
        if job_cgroup.jobs_root(settings.job_cgroup) is None:
            out["cgroup"] = "no cgroup v2 hierarchy the scheduler may write (PARITY_JOB_CGROUP)"
    except job_cgroup.CgroupError as exc:
        out["cgroup"] = str(exc)
    if "cgroup" in out:
        out["limits"] = "the caps live on the job's cgroup"
    for step in ("mounts", "network"):
        why = _probe(step)
        if why is not None:
            out[step] = f"no {'mount' if step == 'mounts' else 'network'} namespace for a job ({why})"
    return out


def required(settings: Settings) -> frozenset[str]:
    """The isolations a local job gets: every one not waived; IsolationMissing when one of them cannot be had
    here (naming it and the setting that would waive it). A waived one is logged at every job."""
    waived = settings.waived_isolations()
    for name in sorted(waived):
        log.warning("a local job runs without isolation %r (PARITY_JOB_ISOLATION_WAIVE, or not root)", name)
    wanted = frozenset(ISOLATIONS) - waived
    if not wanted:
        return wanted
    refused = {k: v for k, v in missing(settings).items() if k in wanted}
    if refused:
        raise IsolationMissing(
            "local jobs cannot start: " + "; ".join(f"{k}: {v}" for k, v in sorted(refused.items()))
            + f" (PARITY_JOB_ISOLATION_WAIVE={','.join(sorted(refused))} runs them without, weaker: docs/security.md)")
    return wanted
