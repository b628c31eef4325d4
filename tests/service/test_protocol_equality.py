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
from tests.run_local import PHASES, LocalReference
from tests.service.scheduler_harness import GOOD, phases, queue, run_row, service_env, start, stop, wait_for

pytestmark = [pytest.mark.megatron, pytest.mark.postgres]

# The specs of tests/jobs' runs of the same (test_parity_megatron's known_good_dp2 in each isolation,
# test_reshard_megatron's good_2_to_1): run_local_reference runs each once a session for both.
BASE = {"config": "moe-fp32-router", "dp": 2, "steps": 5, "save_step": 2, "workarounds": GOOD}
CASES = {
    "process": {**BASE, "isolation": "process"},
    "job": {**BASE, "isolation": "job"},
    "resume_dp": {**BASE, "steps": 6, "save_step": 3, "resume_dp": 1},
}
# What legitimately differs between two launches of the same plan: clocks, folders, job ids, hosts.
VOLATILE = ("seconds", "wall", "time", "folder", "path", "job_id", "pid", "port", "started", "submitit", "node",
            "memory", "rss", "bytes")  # a checkpoint's size on disk includes its own path


def comparable(value: Any) -> Any:
    """The document without what differs between two launches (timings, paths, ids)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if not any(word in k.lower() for word in VOLATILE)}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, str) and ("/tmp/" in value or "/runs/" in value):
        return "<path>"
    return value


@pytest.mark.parametrize("case", sorted(CASES))
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
        differences = list(_differences(comparable(served[phase]), comparable(local.document(phase))))
        assert differences == [], f"{case}: {phase} documents differ (scheduler | run-local)"


def _differences(a: Any, b: Any, where: str = "") -> Any:
    """Each place two documents differ: (path, scheduler's value, run-local's value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                yield f"{where}/{key}", a.get(key, "<absent>"), b.get(key, "<absent>")
            else:
                yield from _differences(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _differences(x, y, f"{where}[{index}]")
    elif a != b:
        yield where, a, b
