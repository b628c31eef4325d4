"""Retention: checkpoints deleted once a verdict is stored (failing runs keep theirs a while),
run folders pruned after PARITY_KEEP_DAYS, disk use on /healthz and /metrics, run-local cleanup."""

from __future__ import annotations

import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from models import Environment, Run
from models.base import utcnow
from service.core.settings import Settings
from service.runs import retention
from tests.plugins.scheduler_harness import PARITY

SPEC = {"config": "moe-fp32-router", "dp": 1, "steps": 4, "save_step": 2}


def _finished_run(session: Session, settings: Settings, *, state: str, verdict: str | None, age: timedelta) -> Run:
    env = session.query(Environment).filter_by(name="retention").one_or_none()
    if env is None:
        env = Environment(name="retention", python="/usr/bin/python3", description="", packages={})
        session.add(env)
        session.flush()
    run = Run(config=SPEC["config"], spec=SPEC, environment_id=env.id, labels={}, state=state, verdict=verdict,
              signatures=[], summary={}, finished_at=utcnow() - age)
    session.add(run)
    session.flush()
    folder = retention.run_dir(settings, run.id)
    (folder / "checkpoint" / "step2").mkdir(parents=True)
    (folder / "checkpoint" / "step2" / "__0_0.distcp").write_bytes(b"\0" * 4096)
    (folder / "train_and_save-attempt1").mkdir()
    (folder / "train_and_save-attempt1" / "1_0_log.err").write_text("log\n")
    return run


def test_checkpoints_go_after_the_verdict_and_failing_ones_later(db_session: Session, tmp_path: Path) -> None:
    settings = Settings(run_folder=tmp_path / "runs", keep_failed_days=14, keep_days=None)
    passed = _finished_run(db_session, settings, state="passed", verdict="pass", age=timedelta(minutes=1))
    failed_new = _finished_run(db_session, settings, state="failed", verdict="fail", age=timedelta(days=1))
    failed_old = _finished_run(db_session, settings, state="error", verdict="error", age=timedelta(days=15))
    cancelled = _finished_run(db_session, settings, state="cancelled", verdict=None, age=timedelta(minutes=1))
    assert retention.apply(db_session, settings) == {"checkpoints": 3, "folders": 0}
    for run, kept in ((passed, False), (failed_new, True), (failed_old, False), (cancelled, False)):
        folder = retention.run_dir(settings, run.id)
        assert (folder / "checkpoint").exists() == kept, (run.state, run.verdict)
        assert (folder / "train_and_save-attempt1" / "1_0_log.err").exists()  # logs stay
        assert (run.checkpoints_deleted_at is None) == kept
    assert retention.apply(db_session, settings) == {"checkpoints": 0, "folders": 0}  # idempotent


def test_run_folders_are_pruned_after_keep_days(db_session: Session, tmp_path: Path) -> None:
    settings = Settings(run_folder=tmp_path / "runs", keep_failed_days=14, keep_days=30)
    young = _finished_run(db_session, settings, state="passed", verdict="pass", age=timedelta(days=29))
    old = _finished_run(db_session, settings, state="failed", verdict="fail", age=timedelta(days=31))
    done = retention.apply(db_session, settings)
    assert done["folders"] == 1
    assert not retention.run_dir(settings, old.id).exists() and old.files_deleted_at is not None
    assert retention.run_dir(settings, young.id).exists() and young.files_deleted_at is None


def test_disk_use_is_on_healthz_and_metrics(client: TestClient, tmp_path: Path) -> None:
    from service.core.settings import get_settings

    root = get_settings().resolved_run_folder
    (root / "run-1").mkdir(parents=True)
    (root / "run-1" / "blob").write_bytes(os.urandom(256 * 1024))
    retention._usage_cache.clear()
    health = client.get("/api/v1/healthz").json()
    assert health["disk"]["run_folder_bytes"] >= 256 * 1024 and health["disk"]["fs_free_bytes"] > 0
    metrics = client.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("parity_run_folder_bytes "))
    assert float(line.split()[1]) >= 256 * 1024
    assert "parity_run_folder_fs_free_bytes " in metrics


@pytest.mark.nightly  # a whole run-local for a temp folder; run-local itself runs in the PR tier (tests/jobs)
@pytest.mark.engine
def test_run_local_removes_its_temporary_folder_unless_keep(tmp_path: Path) -> None:
    args = ["run-local", "--config", "moe-fp32-router", "--dp", "1", "--steps", "4", "--save-step", "2", "--json"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([*PARITY, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert not list(tmp_path.glob("parity-run-*")), "the temporary run folder (with a checkpoint) was left"
    kept = subprocess.run([*PARITY, *args, "--keep"], env=env, capture_output=True, text=True, timeout=600)
    assert kept.returncode in (0, 1), kept.stderr[-3000:]
    (folder,) = tmp_path.glob("parity-run-*")
    assert list(folder.rglob("*_log.out")), "--keep keeps the run folder with its logs"
