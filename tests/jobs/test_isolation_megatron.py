"""Isolation "process": forked phase children share nothing but the checkpoint, and a crash is reported.

The marker test calls the payload in this process (DP 1), so a monkey patch made here is the
code both children inherit, while the marker it sets is state only the saving child has.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from jobs.launch.local import run_parity
from jobs.spec import RunSpec
from tests.plugins.job_faults import plugin_folder, with_plugin

pytestmark = pytest.mark.megatron


def test_resume_child_cannot_see_the_savers_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from jobs.rank import attempt, dist, training

    real = training.run_steps

    def train_with_marker(ctx: Any, trainee: Any, spec: RunSpec, first: int, *args: Any, **kwargs: Any) -> Any:
        module = sys.modules["jobs.rank.training"]
        ctx.doc["info"]["marker_seen"] = getattr(module, "SAVER_MARKER", None)
        ctx.doc["info"]["pid"] = os.getpid()
        if first == 1:
            module.SAVER_MARKER = "set by the saving child"  # type: ignore[attr-defined]
        return real(ctx, trainee, spec, first, *args, **kwargs)

    monkeypatch.setattr(training, "run_steps", train_with_marker)
    spec = RunSpec(config="dense-bf16", dp=1, steps=4, save_step=2, workarounds=("restore-adam-step",))
    # the harness starts no thread before it forks (the test session's own, such as its database
    # dropper, are this process's, not the harness's)
    threads_before = threading.active_count()
    out = attempt.run_attempt(spec.to_dict(), str(tmp_path))  # ports as a job derives them (dist.job_master_port)
    saver, resumer = out["phases"]["train_and_save"], out["phases"]["resume"]
    assert saver["status"] == "ok" and resumer["status"] == "ok", (saver["error"], resumer["error"])
    assert saver["info"]["marker_seen"] is None
    assert resumer["info"]["marker_seen"] is None  # the saver's module state did not reach the resumer
    assert len({os.getpid(), saver["info"]["pid"], resumer["info"]["pid"]}) == 3
    # the parent only imported: no marker, no process group, no rendezvous store, other pids ran the phases
    assert not hasattr(training, "SAVER_MARKER") and not torch.distributed.is_initialized() and dist._store is None
    assert out["info"]["threads_at_fork"] == threads_before
    assert [s["step"] for s in resumer["steps"]] == [3, 4]


@pytest.mark.parametrize("how", [pytest.param("exit", marks=pytest.mark.nightly), "kill"])
def test_child_crash_is_reported_and_hangs_nobody(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults = plugin_folder(tmp_path / "faults", fault=f"build:1:{how}")  # a test-only plugin
    monkeypatch.setenv("PYTHONPATH", with_plugin(dict(os.environ), faults)["PYTHONPATH"])
    spec = RunSpec(config="dense-bf16", dp=2, steps=4, save_step=2)
    r = run_parity(spec, tmp_path)
    assert r["verdict"] == "error" and r["phases"]["resume"] is None
    err = r["error"]
    assert err is not None
    assert err["type"] == "ChildCrashed" and err["rank"] == 1 and err["stage"] == "job"
    # no hang: the peer saw the broken group at once, not through a stage watchdog's timeout
    assert not any(e["type"] == "StageTimeout" for e in err.get("rank_errors", []))
    if how == "exit":
        assert "exited with code 1" in err["message"]
        # the child's own traceback, from the frame that raised
        assert "injected crash in stage build on rank 1" in err["traceback"] and "_inject_fault" in err["traceback"]
    else:
        assert "killed by SIGKILL" in err["message"]
    assert not (tmp_path / "resume").exists()
