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
from tests.plugins.scheduler_harness import GOOD, phases, queue, run_row, service_env, start, stop, wait_for
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
