"""run-local and the scheduler execute one plan (jobs/protocol.py): the same spec through both gives
the same phase documents, timings and paths aside, under process and job isolation and a reshard.

If the two launchers ever decide a payload, a task count or a merge differently, the documents
differ here, and a reproduction printed by the dashboard would stop reproducing what the service ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.launch.local import run_parity
from jobs.protocol import RunPlan
from jobs.spec import RunSpec
from tests.service.scheduler_harness import GOOD, phases, queue, run_to_end, service_env

pytestmark = [pytest.mark.megatron, pytest.mark.postgres]

BASE = {"config": "moe-fp32-router", "dp": 2, "steps": 5, "save_step": 3, "workarounds": GOOD}
CASES = {
    "process": {**BASE, "isolation": "process"},
    "job": {**BASE, "isolation": "job"},
    "resume_dp": {**BASE, "resume_dp": 1},
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
    case: str, committed_db: str, tmp_path: Path
) -> None:
    spec = RunSpec.from_dict(CASES[case])
    local = run_parity(spec, tmp_path / "run-local")
    run_id = queue(spec.to_dict())
    run = run_to_end(service_env(tmp_path, PARITY_EXECUTOR="local"), run_id, tmp_path / "scheduler.log", 900)
    served = {p.name: p.info for p in phases(run_id) if p.state in ("succeeded", "failed")}
    assert run.verdict == local["verdict"] == "pass", (run.verdict, local["verdict"], run.error_message)
    plan = RunPlan.of(spec)
    for phase in ("train_and_save", "resume"):
        local_doc, refused = plan.collect(plan.attempt_folder(tmp_path / "run-local", phase, 1), phase)
        assert local_doc is not None and not refused
        differences = list(_differences(comparable(served[phase]), comparable(local_doc)))
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
