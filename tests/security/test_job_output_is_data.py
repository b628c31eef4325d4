"""What a job writes is data, never code: the scheduler reads the ranks' JSON documents (bounded,
never through a link) and the executor's own state, and never loads a pickle a job could have written.

The attack: code under test (it runs as the job) leaves a result pickle whose unpickling runs a
command, where submitit would look for the job's return value, and links its rank document to a
secret. Before jobs/protocol.py, the reconciler fetched results through submitit (`job.result()`),
which unpickles that file in the scheduler's process.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from submitit.core.utils import JobPaths

from jobs.protocol import MAX_DOCUMENT_BYTES, RunPlan, UnreadableDocument, read_rank_document
from jobs.spec import RunSpec
from models import Environment, Phase, Run
from service.core.settings import Settings, get_settings
from service.executors import launcher
from service.executors.launcher import PhaseJob
from service.runs.records import create_run
from service.scheduler.reconciler import reconcile
from service.scheduler.submitter import claim_queued, launch, next_pending

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3, "isolation": "job"}
GONE_PID = "999999"  # a local job whose process is gone: judged by the files in its folder


class _RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def settings(settings_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("PARITY_EXECUTOR", "local")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def _submitted_phase(session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> tuple[Run, Phase]:
    env = Environment(name="env-hostile", python="/usr/bin/python3", packages={})
    session.add(env)
    session.flush()
    run, _ = create_run(session, spec=RunSpec.from_dict(SPEC), environment=env, labels={}, requester="t")
    monkeypatch.setattr(launcher, "submit_phase", lambda request, _settings: PhaseJob(
        executor="local", folder=str(request.folder), job_id=GONE_PID, tasks=request.tasks))
    claim_queued(session, settings=settings, executor="local")
    phase = next_pending(session)
    assert phase is not None
    launch(session, phase, settings=settings, executor="local")
    return run, phase


def test_a_result_pickle_left_by_the_job_is_never_loaded(
    db_session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run, phase = _submitted_phase(db_session, settings, monkeypatch)
    marker = tmp_path / "the-scheduler-ran-job-code"
    folder = Path(phase.job_folder or "")
    folder.mkdir(parents=True, exist_ok=True)
    hostile = pickle.dumps(("success", _RunsACommand(marker)))
    for task in (None, 0, 1):  # wherever submitit would read the job's or a task's return value
        JobPaths(folder, GONE_PID, task).result_pickle.write_bytes(hostile)
    JobPaths(folder, GONE_PID, 0).stderr.write_text("Traceback ...\nRuntimeError: rank 0 gave up\n")

    reconcile(db_session, settings=settings, executor="local")

    assert not marker.exists(), "the scheduler unpickled a file the job wrote"
    assert phase.state == "failed" and run.state == "evaluating"
    assert "rank 0 gave up" in (run.error_message or ""), run.error_message  # its stderr, read as text


def test_a_rank_document_linked_to_a_secret_is_refused(
    db_session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run, phase = _submitted_phase(db_session, settings, monkeypatch)
    secret = tmp_path / "service-secret"
    secret.write_text('{"status": "ok", "stolen": "PARITY_DATABASE_URL=postgresql://parity:hunter2@db/parity"}')
    attempt = Path(phase.folder or "")
    attempt.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        (attempt / f"result.rank{rank}.json").symlink_to(secret)

    reconcile(db_session, settings=settings, executor="local")

    stored = db_session.scalars(select(Phase).where(Phase.run_id == run.id)).one()
    assert "hunter2" not in str(stored.info) and "hunter2" not in str(run.error_message)
    assert stored.state == "failed" and "symbolic link" in (run.error_message or ""), run.error_message


def test_documents_are_read_bounded_and_only_from_regular_files(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(UnreadableDocument, match="more than"):
        read_rank_document(big)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UnreadableDocument, match="not a regular file"):
        read_rank_document(fifo)  # a FIFO would block a reader forever
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(UnreadableDocument, match="not a JSON object"):
        read_rank_document(listed)
    plan = RunPlan.of(SPEC)
    doc, refused = plan.collect(tmp_path / "nothing-here", "train_and_save")
    assert doc is None and refused == []
