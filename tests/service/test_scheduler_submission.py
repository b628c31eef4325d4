"""Submission against real Slurm: a job is never requeued behind our back, never left pending forever,
and never submitted twice, even when the scheduler dies between sbatch and submitit's bookkeeping."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from service.scheduler.submitter import launcher_folder
from tests.plugins.crashing_scheduler import EXIT_AFTER_SBATCH
from tests.plugins.scheduler_harness import (
    GOOD,
    PARITY,
    job_name,
    phases,
    queue,
    queued_jobs,
    run_row,
    sacct_jobs,
    service_env,
    slurm_now,
    start,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slurm]
SMALL = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4, "workarounds": GOOD}


def _scontrol(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout


@pytest.mark.nightly
def test_a_job_pending_too_long_is_cancelled_and_retried_in_a_new_folder(
    committed_db: str, slurm: str, tmp_path: Path
) -> None:
    # held jobs never start: only the pending deadline can move the run on
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_SLURM_EXTRA_ARGS="hold",
                      PARITY_PENDING_TIMEOUT_S="4", PARITY_MAX_INFRA_RETRIES="1")
    run_id = queue(SMALL)
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        first = wait_for(lambda: next((p.job_id for p in phases(run_id) if p.job_id), None), 60, "a submission",
                         alive=[scheduler])
        # submitted without requeue: a preempted or failed node never starts this attempt again
        assert "Requeue=0" in _scontrol(first)
        assert "#SBATCH --no-requeue" in (launcher_folder(phases(run_id)[0]) / f"{first}_submission.sh").read_text()
        wait_for(lambda: run_row(run_id).finished_at, 90, "the run to end", alive=[scheduler])
    finally:
        stop(scheduler)
    rows = phases(run_id)
    try:
        assert run_row(run_id).state == "error" and run_row(run_id).verdict is None
        assert [(p.attempt, p.state) for p in rows] == [(1, "infra_failed"), (2, "infra_failed")]
        assert all("after 4s" in (p.exit_reason or "") for p in rows), [p.exit_reason for p in rows]
        assert len({p.folder for p in rows}) == 2 and len({p.job_name for p in rows}) == 2
        # each attempt was cancelled before the next existed: nothing of this run is left in the queue
        wait_for(lambda: not any(queued_jobs(p.job_name or "") for p in rows), 30, "the queue to empty")
    finally:
        subprocess.run(["scancel", *[p.job_id for p in rows if p.job_id]], check=False)


@pytest.mark.megatron
def test_scheduler_killed_between_sbatch_and_the_pickle_rename_adopts_the_job(
    committed_db: str, slurm: str, tmp_path: Path
) -> None:
    since = slurm_now()
    run_id = queue(SMALL)
    # the first scheduler exits right after sbatch answered, before submitit names the job's pickle
    # (a test-only entry point: the service reads no fault-injection variable)
    crashing = start([], service_env(tmp_path, PARITY_EXECUTOR="slurm"), tmp_path / "scheduler-1.log",
                     command=[PARITY[0], "-m", "tests.plugins.crashing_scheduler"])
    assert crashing.wait(timeout=120) == EXIT_AFTER_SBATCH, (tmp_path / "scheduler-1.log").read_text()[-2000:]
    pending = phases(run_id)[0]
    assert (pending.state, pending.job_id) == ("pending", None)  # nothing recorded, but the job exists
    orphan = queued_jobs(job_name(pending))
    assert len(orphan) == 1 and not list(launcher_folder(pending).glob("*_submitted.pkl"))

    second = start(["scheduler"], service_env(tmp_path, PARITY_EXECUTOR="slurm"), tmp_path / "scheduler-2.log")
    try:
        wait_for(lambda: run_row(run_id).finished_at, 480, "the verdict", alive=[second])
    finally:
        stop(second, signal.SIGTERM)
        # on a busy shared node the wait can run out: leave nothing of this run in the queue
        subprocess.run(["scancel", *[p.job_id for p in phases(run_id) if p.job_id], *orphan], check=False)
    run = run_row(run_id)
    assert run.state == "passed", (run.state, run.error_message)
    rows = phases(run_id)
    assert [(p.name, p.attempt, p.state) for p in rows] == [("train_and_save", 1, "succeeded"),
                                                            ("resume", 1, "succeeded")]
    assert rows[0].job_id == orphan[0]  # adopted, not submitted again
    wait_for(lambda: sacct_jobs(rows[1].job_name or "", since), 30, "accounting of the resume job")
    assert sacct_jobs(rows[0].job_name or "", since) == [orphan[0]]
    assert "found Slurm job" in (tmp_path / "scheduler-2.log").read_text()
