"""A resume at another DP size (resume_dp) through the scheduler on real Slurm: a job per phase, sized per phase."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.run_folder import AttemptFolder
from tests.plugins.scheduler_harness import GOOD, phases, queue, run_to_end, service_env

pytestmark = [pytest.mark.slurm, pytest.mark.megatron, pytest.mark.timeout(600)]


@pytest.mark.nightly
def test_resume_dp_run_saves_at_dp_2_and_resumes_in_a_one_rank_job(
    committed_db: str, slurm: str, tmp_path: Path
) -> None:
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm")
    spec = {"config": "moe-fp32-router", "dp": 2, "resume_dp": 1, "steps": 6, "save_step": 3, "workarounds": GOOD}
    run_id = queue(spec)  # isolation left at its default ("process"): a reshard still gets a job per phase
    # generous: on the shared single-node Slurm the jobs may wait behind other sessions' jobs
    run = run_to_end(env, run_id, tmp_path / "scheduler.log", timeout=1800)
    assert run.state == "passed", (run.state, run.error_message, run.signatures)
    assert run.spec["resume_dp"] == 1
    assert run.summary["isolation"] == "job"
    # judged by the profile measured for this config and direction (jobs/calibration/reshard.json)
    assert run.summary["reshard"]["resume_dp"] == 1
    assert run.summary["reshard"]["tolerance"] == "reshard:moe-fp32-router:2->1"
    rows = phases(run_id)
    assert [(p.name, p.attempt, p.state) for p in rows] == [
        ("train_and_save", 1, "succeeded"), ("resume", 1, "succeeded"),
    ]
    assert len({p.job_id for p in rows}) == 2  # the resume ran in its own allocation
    assert rows[0].info["info"]["world_size"] == 2 and rows[1].info["info"]["world_size"] == 1
    saved, resumed = (AttemptFolder(Path(p.folder or "")) for p in rows)
    assert saved.rank_log(1).is_file()
    assert resumed.rank_log(0).is_file() and not resumed.rank_log(1).exists()  # one task, one rank
