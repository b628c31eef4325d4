"""run-local and the scheduler execute one plan (jobs/protocol.py): the same spec through both gives
the same phase documents, timings and paths aside, under process and job isolation and a reshard.

If the two launchers ever decide a payload, a task count or a merge differently, the documents
differ here, and a reproduction printed by the dashboard would stop reproducing what the service ran.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobs.spec import RunSpec
from tests.plugins.documents import comparable, differences
from tests.plugins.run_local import PHASES, LocalReference
from tests.plugins.scheduler_harness import (
    GOOD,
    live_workers,
    phases,
    queue,
    queue_suite,
    run_row,
    service_env,
    start,
    stop,
    wait_for,
)
from tests.plugins.tiers import tiered

pytestmark = [pytest.mark.megatron, pytest.mark.postgres, pytest.mark.timeout(900)]

# The specs of tests/jobs' runs of the same (test_parity_megatron's known_good_dp2 in each isolation,
# test_reshard_megatron's good_2_to_1): run_local_reference runs each once a session for both.
BASE = {"config": "moe-fp32-router", "dp": 2, "steps": 5, "save_step": 2, "workarounds": GOOD}
CASES = {
    "process": {**BASE, "isolation": "process"},
    "job": {**BASE, "isolation": "job"},
    "resume_dp": {**BASE, "steps": 6, "save_step": 3, "resume_dp": 1},
}


# the PR tier compares the "process" case; "job" and the reshard are nightly
@pytest.mark.parametrize("case", tiered(sorted(CASES), ["process"]))
def test_run_local_and_the_scheduler_write_the_same_phase_documents(
    case: str, committed_db: str, tmp_path: Path, run_local_reference: Callable[[dict[str, Any]], LocalReference]
) -> None:
    spec = RunSpec.from_dict(CASES[case])
    run_id = queue(spec.to_dict())
    scheduler = start(["scheduler"], service_env(tmp_path, PARITY_EXECUTOR="local"), tmp_path / "scheduler.log")
    try:
        # run-local runs while the scheduler runs the same spec (each waits on its jobs much of the time);
        # the "process" case's run-local is the warm-pool walk's reference too, made once a session
        local = run_local_reference(CASES[case])
        wait_for(lambda: run_row(run_id).finished_at, 900, "the run to end", alive=[scheduler])
    finally:
        stop(scheduler)
    run = run_row(run_id)
    served = {p.name: p.info for p in phases(run_id) if p.state in ("succeeded", "failed")}
    assert run.verdict == local.verdict == "pass", (run.verdict, local.verdict, run.error_message)
    for phase in PHASES:
        found = list(differences(comparable(served[phase]), comparable(local.document(phase))))
        assert found == [], f"{case}: {phase} documents differ (scheduler | run-local)"


# A 2-check suite of the same world size: with PARITY_SUITE_WARM (the default) and no PARITY_POOL, one worker
# started on demand for its environment serves every phase of both checks; off, each phase is its own job.
# Either way each check writes run-local's documents of its spec.
SUITE = {"process": CASES["process"], "job": CASES["job"]}


# the PR tier walks the warm suite; the cold path is every other scheduler test's
@pytest.mark.parametrize("warm", [pytest.param(True, id="suite-warm"),
                                  pytest.param(False, id="suite-cold", marks=pytest.mark.nightly)])
def test_a_suites_checks_write_the_cold_documents_warm_or_not(
    warm: bool, committed_db: str, tmp_path: Path, run_local_reference: Callable[[dict[str, Any]], LocalReference]
) -> None:
    run_ids = queue_suite("equality", SUITE)
    runs = tmp_path / "runs"
    env = service_env(tmp_path, PARITY_EXECUTOR="local", PARITY_SUITE_WARM=str(warm).lower(),
                      PARITY_SUITE_WORKER_IDLE_S="3")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        local = {name: run_local_reference(spec) for name, spec in SUITE.items()}
        wait_for(lambda: all(run_row(i).finished_at for i in run_ids.values()), 900, "the suite's checks",
                 alive=[scheduler])
        # done with its suite, the on-demand worker is let go once idle
        wait_for(lambda: not live_workers(runs), 120, "the suite's worker to be let go", alive=[scheduler])
    finally:
        stop(scheduler)
    job_names = set()
    for name, run_id in run_ids.items():
        run, served = run_row(run_id), [p for p in phases(run_id) if p.state == "succeeded"]
        assert run.verdict == local[name].verdict == "pass", (name, run.verdict, run.error_message)
        job_names |= {p.job_name or "" for p in served}
        for phase in PHASES:
            document = next(p.info for p in served if p.name == phase)
            assert list(differences(comparable(document), comparable(local[name].document(phase)))) == [], \
                (name, phase)
    if warm:  # every phase of both checks on one worker, the only one started
        assert all(n.startswith("pool:") for n in job_names), job_names
        workers = {n.split(":")[1] for n in job_names}
        assert len(workers) == 1 == len(list((runs / "pool").glob("*.worker.json"))), job_names
    else:
        assert not any(n.startswith("pool:") for n in job_names) and not (runs / "pool").exists(), job_names
