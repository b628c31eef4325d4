"""Slurm jobs found by name: the record that survives a submitter killed right after sbatch.

submitit dumps the call to `<uuid>.pkl`, runs sbatch, then renames the file to `<id>_submitted.pkl`;
the job waits up to a minute for that name. A scheduler killed in between leaves a live job that no
file names. Every job's name says run, phase and attempt, so it can be found and adopted.
"""

from __future__ import annotations

import logging
import subprocess
from datetime import datetime
from pathlib import Path

log = logging.getLogger(__name__)

# Slurm states of a job that is not over yet (squeue still lists it).
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"})


def _stray_pickles(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("*.pkl") if not p.name.endswith(("_submitted.pkl", "_result.pkl"))]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def interrupted_submission(folder: Path) -> bool:
    """Whether a submission from folder may have reached sbatch without being recorded (a stray `<uuid>.pkl`)."""
    return bool(_stray_pickles(folder))


def find_slurm_job(name: str, since: datetime) -> tuple[str, str] | None:
    """(job id, state) of the newest Slurm job named `name` submitted since `since`, if any."""
    start = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # sacct reads local time
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", f"--name={name}", "-S", start, "-o", "JobID,State"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    rows = [line.split("|") for line in out.stdout.splitlines() if "|" in line]
    queued = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i|%T"], capture_output=True, text=True,
                            timeout=60, check=True)
    # squeue knows a job sacct has not recorded yet; sacct knows jobs that already ended
    rows += [line.split("|") for line in queued.stdout.splitlines() if "|" in line]
    found = sorted({(int(j), s.split()[0]) for j, s in rows if j.isdigit()})
    return (str(found[-1][0]), found[-1][1]) if found else None


def adopt_slurm_job(folder: Path, job_id: str) -> None:
    """Finish a submission cut short after sbatch: give the job its pickle under its job id."""
    target = folder / f"{job_id}_submitted.pkl"
    if target.exists():
        return
    pending = _stray_pickles(folder)
    if pending:
        pending[-1].rename(target)
        log.info("adopted Slurm job %s: moved %s to %s", job_id, pending[-1].name, target.name)
