"""submitit against the real single-node Slurm (and the local executor without one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit
from submitit.core.utils import UncompletedJobError

# Jobs unpickle these functions in a fresh interpreter where this test module is not importable.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def whoami() -> dict[str, object]:
    """Report this task's rank as submitit and torch.distributed would see it."""
    env = submitit.JobEnvironment()
    dist = submitit.helpers.TorchDistributedEnvironment().export()
    return {
        "global_rank": env.global_rank,
        "local_rank": env.local_rank,
        "num_tasks": env.num_tasks,
        "job_id": str(env.job_id),
        "RANK": os.environ["RANK"],
        "WORLD_SIZE": os.environ["WORLD_SIZE"],
        "master": (dist.master_addr, dist.master_port),
    }


def sleep_forever() -> None:
    """Stand-in for a hung training step."""
    time.sleep(600)


def _two_rank_executor(folder: Path, cluster: str) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(tasks_per_node=2, nodes=1, cpus_per_task=1, timeout_min=5)
    return executor


def _assert_two_ranks(results: list[dict[str, object]], job_id: str) -> None:
    assert [r["global_rank"] for r in results] == [0, 1]
    assert [r["local_rank"] for r in results] == [0, 1]
    assert {r["num_tasks"] for r in results} == {2}
    assert [r["RANK"] for r in results] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in results} == {"2"}
    assert len({r["master"] for r in results}) == 1, "ranks disagree on MASTER_ADDR/PORT"
    assert {r["job_id"] for r in results} == {job_id}


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True, timeout=10
    )
    return out.stdout.strip().split(" ")[0]


def _wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.5)


@pytest.mark.slurm
def test_slurm_job_with_two_tasks_returns_both_ranks(slurm_cluster: str, tmp_path: Path) -> None:
    executor = _two_rank_executor(tmp_path / "submitit", "slurm")
    assert executor.cluster == "slurm"
    job = executor.submit(whoami)
    _assert_two_ranks(job.results(), job.job_id)
    _wait_until(lambda: _sacct_state(job.job_id) == "COMPLETED", 30, "sacct to say COMPLETED")


def test_local_executor_with_two_tasks_returns_both_ranks(tmp_path: Path) -> None:
    executor = _two_rank_executor(tmp_path / "submitit", "local")
    job = executor.submit(whoami)
    _assert_two_ranks(job.results(), job.job_id)


@pytest.mark.nightly
@pytest.mark.slurm
def test_scancel_of_running_job_is_reported_cancelled(slurm_cluster: str, tmp_path: Path) -> None:
    executor = _two_rank_executor(tmp_path / "submitit", "slurm")
    job = executor.submit(sleep_forever)
    try:
        _wait_until(lambda: _sacct_state(job.job_id) == "RUNNING", 300, "the job to run")
    finally:  # a job that never gets cancelled would hold the node's CPUs for every later test
        subprocess.run(["scancel", job.job_id], check=True, timeout=10)

    _wait_until(lambda: _sacct_state(job.job_id) == "CANCELLED", 60, "sacct to say CANCELLED")
    _wait_until(lambda: job.done(force_check=True), 30, "submitit to see the job done")
    assert job.state.startswith("CANCELLED")
    # No result file will ever come; submitit waits 15 s for one by default before giving up.
    job._results_timeout_s = 1
    for task in job._sub_jobs:
        task._results_timeout_s = 1
    with pytest.raises(UncompletedJobError, match="has not produced any output"):
        job.results()
