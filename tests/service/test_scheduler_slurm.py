"""The scheduler against real Slurm: restarts, cancellations, replicas. Real Megatron-Core jobs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.run_folder import AttemptFolder
from tests.plugins.job_faults import plugin_folder, with_plugin
from tests.plugins.scheduler_harness import (
    GOOD,
    job_name,
    jobs_gone,
    phase_moves,
    phases,
    queue,
    queued_jobs,
    register_environment,
    run_row,
    run_to_end,
    sacct_jobs,
    service_env,
    slurm_now,
    start,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron, pytest.mark.timeout(600)]
SMALL = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4, "workarounds": GOOD}


@pytest.mark.parametrize(
    ("executor", "isolation"), [("slurm", "process"), pytest.param("slurm", "job", marks=pytest.mark.nightly),
                              pytest.param("local", "process", marks=pytest.mark.nightly)]
)
def test_scheduler_killed_mid_run_resumes_without_double_submission(
    committed_db: str, slurm: str, tmp_path: Path, executor: str, isolation: str
) -> None:
    env = service_env(tmp_path, PARITY_EXECUTOR=executor)
    # the run's environment names its own Python: a wrapper that leaves a mark, then runs ours
    marker = tmp_path / "wrapper-used"
    wrapper = tmp_path / "env-python"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> {marker}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    since = slurm_now()
    run_id = queue({**SMALL, "isolation": isolation}, environment=register_environment("wrapped", str(wrapper)))
    first = start(["scheduler"], env, tmp_path / "scheduler-1.log")
    try:
        # generous: on the shared single-node Slurm the job may first wait behind other sessions' jobs
        wait_for(lambda: run_row(run_id).state in ("train_running", "resume_submitted", "resume_running"), 600,
                 "phase 1 running", alive=[first])
    finally:
        stop(first, signal.SIGKILL)  # no clean shutdown: the job keeps running (in Slurm, or orphaned locally)
    second = start(["scheduler"], env, tmp_path / "scheduler-2.log")
    try:
        wait_for(lambda: run_row(run_id).finished_at, 300, "the verdict", alive=[second])
    finally:
        stop(second)
    run = run_row(run_id)
    assert run.state == "passed", (run.state, run.error_message, run.signatures)
    assert run.summary["isolation"] == isolation
    rows = phases(run_id)
    assert [(p.name, p.attempt, p.state) for p in rows] == [
        ("train_and_save", 1, "succeeded"), ("resume", 1, "succeeded"),
    ]
    jobs = 1 if isolation == "process" else 2  # one allocation runs both phases, or one job per phase
    assert len({p.job_id for p in rows}) == jobs
    if executor == "slurm":
        jobs_gone(run_id)
        # accounting lags the job's end by a moment
        assert rows[0].job_name == job_name(rows[0])
        wait_for(lambda: sacct_jobs(rows[0].job_name or "", since), 30, "accounting of the job")
        assert sacct_jobs(rows[0].job_name or "", since) == [rows[0].job_id]
        if isolation == "job":
            assert rows[1].job_name == job_name(rows[1])
            wait_for(lambda: sacct_jobs(rows[1].job_name or "", since), 30, "accounting of the resume job")
            assert sacct_jobs(rows[1].job_name or "", since) == [rows[1].job_id]
        else:  # the resume ran inside the train_and_save attempt's job
            assert rows[1].job_name == rows[0].job_name
    # every attempt keeps its own rank logs, and the checkpoint lives in the attempt that saved it
    saved, resumed = (AttemptFolder(Path(p.folder or "")) for p in rows)
    assert saved.rank_log(0).is_file() and resumed.rank_log(1).is_file()
    # (retention deletes a passing run's checkpoint once the verdict is stored: check where it was written)
    assert rows[0].info["info"]["checkpoint"]["path"] == str(saved.checkpoint(4))  # save_step 4
    assert rows[0].info["info"]["checkpoint"]["bytes"] > 0 and not resumed.checkpoint(4).exists()
    assert len(marker.read_text().split()) == 2 * jobs  # every job's 2 ranks ran under the environment's Python
    assert run.summary["packages"]["megatron_core"] == "0.16.1"


def test_scancelled_job_is_retried_then_reported_as_error(committed_db: str, slurm: str, tmp_path: Path) -> None:
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_MAX_INFRA_RETRIES="1")
    run_id = queue(SMALL)
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        for attempt in (1, 2):

            def submitted(a: int = attempt) -> str | None:
                return next((p.job_id for p in phases(run_id) if p.attempt == a and p.job_id), None)

            job_id = wait_for(submitted, 120, f"attempt {attempt} submitted", alive=[scheduler])
            subprocess.run(["scancel", job_id], check=True)
        wait_for(lambda: run_row(run_id).finished_at, 180, "the run to end", alive=[scheduler])
    finally:
        stop(scheduler)
    run = run_row(run_id)
    assert run.state == "error"
    assert run.verdict is None  # an infrastructure failure is not a parity result
    assert "CANCELLED" in (run.error_message or "")
    assert [(p.attempt, p.state) for p in phases(run_id)] == [(1, "infra_failed"), (2, "infra_failed")]


@pytest.mark.nightly
def test_two_replicas_submit_each_of_50_runs_exactly_once(committed_db: str, slurm: str, tmp_path: Path) -> None:
    # Jobs are submitted held (sbatch --hold) so the test measures submission, not training.
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_SLURM_EXTRA_ARGS="hold")
    run_ids = [queue({**SMALL, "seed": i}) for i in range(50)]
    replicas = [start(["scheduler"], env, tmp_path / f"replica-{i}.log") for i in range(2)]
    try:
        wait_for(lambda: all(any(p.job_id for p in phases(r)) for r in run_ids), 240, "50 submissions", poll=1,
                 alive=replicas)
    finally:
        for proc in replicas:
            stop(proc)
    all_phases = [p for r in run_ids for p in phases(r)]
    try:
        assert len(all_phases) == 50
        assert len({p.job_id for p in all_phases}) == 50
        for run_id in run_ids:
            assert queued_jobs(phases(run_id)[0].job_name or "") == [
                p.job_id for p in phases(run_id)
            ], f"run {run_id} should have exactly one job in the Slurm queue"
    finally:
        job_ids = [p.job_id for p in all_phases if p.job_id]
        subprocess.run(["scancel", *job_ids], check=False)
        # leave the node idle for the next test: held jobs linger a few seconds while being cancelled
        wait_for(lambda: not _in_queue(job_ids), 90, "the held jobs to leave the queue")


def test_cancel_through_the_api_stops_the_slurm_job(committed_db: str, slurm: str, tmp_path: Path) -> None:
    from service.core.db import session_scope
    from service.runs.records import cancel_run

    env = service_env(tmp_path, PARITY_EXECUTOR="slurm")
    since = slurm_now()
    run_id = queue(SMALL)
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: run_row(run_id).state == "train_running", 120, "phase 1 running", alive=[scheduler])
        with session_scope() as session:
            cancel_run(session, run_id=run_id)
        wait_for(lambda: run_row(run_id).finished_at, 60, "the cancellation", alive=[scheduler])
    finally:
        stop(scheduler)
    run = run_row(run_id)
    assert run.state == "cancelled" and run.verdict is None
    assert [(p.name, p.state) for p in phases(run_id)] == [("train_and_save", "cancelled")]
    job_id = phases(run_id)[0].job_id
    # the phase waited in `cancelling` until Slurm itself reported the job ended
    assert phase_moves(run_id)[-2:] == [("running", "cancelling"), ("cancelling", "cancelled")]
    assert _sacct_state(job_id, since).startswith("CANCELLED")


def _sacct_state(job_id: str | None, since: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State", "-S", since],
                         capture_output=True, text=True)
    return out.stdout.strip()


@pytest.mark.nightly
def test_refused_submission_is_retried_then_reported(committed_db: str, slurm: str, tmp_path: Path) -> None:
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_MAX_INFRA_RETRIES="1",
                      PARITY_SLURM_PARTITION="no-such-partition")
    run_id = queue(SMALL)
    run = run_to_end(env, run_id, tmp_path / "scheduler.log", timeout=60)
    assert run.state == "error" and run.verdict is None
    assert "submission failed" in (run.error_message or "") and "partition" in (run.error_message or "").lower()
    rows = phases(run_id)
    assert [(p.attempt, p.state, p.job_id) for p in rows] == [(1, "infra_failed", None), (2, "infra_failed", None)]


def test_a_failing_rank_ends_the_run_in_error_without_hanging(committed_db: str, slurm: str, tmp_path: Path) -> None:
    # rank 1 fails in training; rank 0 must not wait forever in a collective, and the run reports why
    # the fault comes from a test-only plugin on the jobs' PYTHONPATH (tests/plugins/job_faults.py)
    env = with_plugin(service_env(tmp_path, PARITY_EXECUTOR="slurm"),
                      plugin_folder(tmp_path / "faults", fault="step:1"))
    run_id = queue(SMALL)
    run = run_to_end(env, run_id, tmp_path / "scheduler.log", timeout=240)
    assert run.state == "error", (run.state, run.signatures)
    assert [(p.name, p.attempt) for p in phases(run_id)] == [("train_and_save", 1)]  # not retried
    error = run.summary["error"]
    assert error["stage"] == "step" and error["rank"] == 1


def _in_queue(job_ids: list[str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return sorted(set(out.stdout.split()) & set(job_ids))
