"""Scheduler steps on real Postgres and real local submitit jobs (tiny payloads, no Megatron).

A document Postgres refuses stalls nobody and ends its own run in error; NaN/Infinity survive the
trip through JSONB; a local job is known by pid + start time and can be stopped after a restart;
a phase running past its deadline is stopped and retried in a folder of its own.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select, text

from jobs.run_folder import AttemptFolder
from models import Phase, PhaseEvent, Run, StepMetric
from models.base import utcnow
from service.core.db import session_scope
from service.core.phase_state import PhaseState, move_phase
from service.core.run_state import RunState
from service.core.settings import Settings
from service.executors import launcher
from service.runs.lifecycle import transition
from service.runs.records import cancel_run
from service.scheduler.evaluation import evaluate_pending
from service.scheduler.reconciler import reconcile
from service.scheduler.submitter import job_of, launcher_folder, new_phase
from tests.plugins.scheduler_harness import phases, queue, run_row, wait_for
from tests.plugins.scheduler_jobs import SPEC, fail_rendezvous, phase_doc, sleep_forever, write_document


@pytest.fixture
def settings(committed_db: str, tmp_path: Path) -> Settings:
    return Settings(database_url=committed_db, run_folder=tmp_path / "runs", max_row_failures=3,
                    retry_backoff_seconds=0, executor="local")


def _submit(run_id: int, settings: Settings, function: object, *args: object) -> None:
    """Give the run a submitted train_and_save phase whose job is function(*args), as a local job."""
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        phase = new_phase(session, run=run, name="train_and_save", attempt=1, settings=settings, executor="local")
        transition(session, run, RunState.TRAIN_SUBMITTED, "test")
        if function in (write_document, fail_rendezvous):  # the ranks' documents go to the attempt's own folder
            args = (str(phase.folder), *args)
        job = launcher.submit_phase(launcher.JobRequest(
            executor="local", folder=launcher_folder(phase), python=sys.executable, tasks=int(SPEC["dp"]), name="t",
            function=function, args=args), settings)
        phase.job_id, phase.process_started_at = job.job_id, job.started
        move_phase(session, phase, PhaseState.SUBMITTED, "test")


def _job_done(run_id: int) -> bool:
    with session_scope() as session:
        phase = session.scalars(select(Phase).where(Phase.run_id == run_id)).one()
        run = session.get(Run, run_id)
        assert run is not None
        return launcher.poll([job_of(phase, run)])[job_of(phase, run)].kind == "done"


def _reconcile(settings: Settings) -> None:
    with session_scope() as session:
        reconcile(session, settings=settings, executor="local")


def test_a_refused_document_ends_its_own_run_and_stalls_no_other(settings: Settings) -> None:
    bad = queue(SPEC)  # the lower id: a pass that stops at the first bad row would never reach `good`
    good = queue(SPEC)
    _submit(bad, settings, write_document, phase_doc("train_and_save", save_seconds="n/a"))
    _submit(good, settings, write_document, phase_doc("train_and_save", save_seconds=1.5))
    wait_for(lambda: _job_done(bad) and _job_done(good), 60, "both jobs to finish")

    _reconcile(settings)
    assert run_row(good).state == "resume_submitted"  # moved on the very first pass
    assert (run_row(bad).state, run_row(bad).scheduler_failures) == ("train_submitted", 1)
    with session_scope() as session:  # the NaN loss and the infinite wall time are stored, as strings
        stored = session.scalar(text("select info->'steps' from phases where run_id = :r"), {"r": good})
    assert [s["loss"] for s in stored][4] == "NaN" and stored[-1]["wall_s"] == "Infinity"

    for _ in range(settings.max_row_failures - 1):
        _reconcile(settings)
    run = run_row(bad)
    assert run.state == "error" and run.verdict is None
    assert "gave up after 3 failed tries" in (run.error_message or "")
    assert "double precision" in (run.error_message or "")  # the database's own reason
    assert [(p.name, p.state) for p in phases(bad)] == [("train_and_save", "error")]


def _evaluating(run_id: int, docs: dict[str, dict]) -> None:
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        for name, doc in docs.items():
            phase = Phase(run_id=run_id, name=name, attempt=1, state="pending", executor="local",
                          folder="/nonexistent", info=doc, log_paths=[])
            session.add(phase)
            session.flush()
            move_phase(session, phase, PhaseState.SUBMITTED)
            move_phase(session, phase, PhaseState.SUCCEEDED)
        for state in (RunState.TRAIN_SUBMITTED, RunState.RESUME_SUBMITTED, RunState.EVALUATING):
            transition(session, run, state, "test")


def test_evaluation_isolates_a_refused_result_and_nan_losses_compare_equal(settings: Settings) -> None:
    bad, good = queue(SPEC), queue(SPEC)
    for run_id in (bad, good):
        _evaluating(run_id, {"train_and_save": phase_doc("train_and_save"), "resume": phase_doc("resume")})
    # Postgres itself refuses the bad run's step rows, as it would an out-of-range or malformed value
    poison = f"""
        create function refuse_run() returns trigger language plpgsql as $$
        begin
            if new.run_id = {bad} then
                raise exception 'step value refused for run %', new.run_id using errcode = '22003';
            end if;
            return new;
        end $$;
        create trigger refuse_run before insert on step_metrics for each row execute function refuse_run();
    """
    with session_scope() as session:
        session.execute(text(poison))
    try:
        for _ in range(settings.max_row_failures):
            with session_scope() as session:
                evaluate_pending(session, settings=settings)
    finally:
        with session_scope() as session:
            session.execute(text("drop trigger refuse_run on step_metrics; drop function refuse_run();"))
    run = run_row(good)
    # step 5 is NaN on both sides: reproduced exactly, so the run passes
    assert (run.state, run.verdict, run.first_divergent_step) == ("passed", "pass", None)
    with session_scope() as session:
        loss = session.scalar(select(StepMetric.loss_baseline).where(StepMetric.run_id == good, StepMetric.step == 5))
    assert loss is not None and math.isnan(loss)
    failed = run_row(bad)
    assert failed.state == "error" and failed.verdict is None
    message = failed.error_message or ""
    assert "evaluation: DataError" in message and "step value refused" in message


def test_nan_documents_round_trip_and_postgres_refuses_raw_nan(settings: Settings) -> None:
    from models.jsonsafe import decode_nonfinite

    doc = {"loss": math.nan, "hi": math.inf, "lo": -math.inf, "msg": "a\x00b", "ok": 1.5}
    run_id = queue(SPEC)
    with session_scope() as session:
        session.add(Phase(run_id=run_id, name="resume", attempt=1, state="pending", executor="local",
                          folder="/x", info=doc, log_paths=[]))
    back = decode_nonfinite(phases(run_id)[0].info)
    assert math.isnan(back["loss"]) and back["hi"] == math.inf and back["lo"] == -math.inf
    assert back["msg"] == "a\ufffdb" and back["ok"] == 1.5
    # without the encoding, Postgres refuses the same document
    from sqlalchemy.exc import DataError

    with pytest.raises(DataError), session_scope() as session:
        session.execute(text("update phases set info = cast(:d as jsonb)"), {"d": json.dumps(doc)})


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _orphan_job(settings: Settings, folder: Path, marker: Path) -> tuple[str, float]:
    """Submit sleep_forever from another process that then exits: what a restarted scheduler finds."""
    code = (
        "import sys; from pathlib import Path; from service.executors import launcher; "
        "from service.core.settings import Settings; from tests.plugins.scheduler_jobs import sleep_forever; "
        f"j = launcher.submit_phase(launcher.JobRequest(executor='local', folder=Path({str(folder)!r}), "
        f"python=sys.executable, tasks=2, name='t', function=sleep_forever, args=({str(marker)!r},)), Settings()); "
        "print(j.job_id, repr(j.started))"
    )
    # output to a file, not a pipe: the controller it leaves behind keeps its stdout open
    printed = folder.parent / "submitter.out"
    folder.mkdir(parents=True, exist_ok=True)
    with printed.open("w") as fh:
        subprocess.run([sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=60,
                       env={**os.environ, "PARITY_RUN_FOLDER": str(settings.resolved_run_folder)})
    job_id, started = printed.read_text().split()[-2:]
    return job_id, float(started)


def test_local_job_is_cancelled_after_a_scheduler_restart(settings: Settings, tmp_path: Path) -> None:
    run_id = queue(SPEC)
    marker = tmp_path / "pids"
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        phase = new_phase(session, run=run, name="train_and_save", attempt=1, settings=settings, executor="local")
        transition(session, run, RunState.TRAIN_SUBMITTED, "test")
        phase.job_id, phase.process_started_at = _orphan_job(settings, launcher_folder(phase), marker)
        move_phase(session, phase, PhaseState.SUBMITTED)
    wait_for(lambda: marker.exists() and len(marker.read_text().split()) == 2, 60, "both ranks to start")
    ranks = [int(p) for p in marker.read_text().split()]
    controller = int(phases(run_id)[0].job_id or 0)
    _reconcile(settings)
    assert phases(run_id)[0].state == "running"
    with session_scope() as session:
        cancel_run(session, run_id=run_id)
    _reconcile(settings)  # asks the executor: the phase waits in `cancelling`
    assert phases(run_id)[0].state == "cancelling" and run_row(run_id).state == "train_running"
    wait_for(lambda: not _alive([controller, *ranks]), 30, "the controller and both ranks to exit")
    _reconcile(settings)
    assert phases(run_id)[0].state == "cancelled" and run_row(run_id).state == "cancelled"
    with session_scope() as session:
        moves = session.execute(select(PhaseEvent.from_state, PhaseEvent.to_state)
                                .order_by(PhaseEvent.id)).tuples().all()
    assert moves == [(None, "pending"), ("pending", "submitted"), ("submitted", "running"),
                     ("running", "cancelling"), ("cancelling", "cancelled")]


def test_a_reused_pid_is_not_our_job(settings: Settings) -> None:
    run_id = queue(SPEC)
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        phase = new_phase(session, run=run, name="train_and_save", attempt=1, settings=settings, executor="local")
        transition(session, run, RunState.TRAIN_SUBMITTED, "test")
        # a live process (this test) under the recorded pid, but not the one that was started
        phase.job_id, phase.process_started_at = str(os.getpid()), psutil.Process().create_time() - 100
        move_phase(session, phase, PhaseState.SUBMITTED)
    _reconcile(settings)
    rows = phases(run_id)
    assert [(p.attempt, p.state) for p in rows] == [(1, "infra_failed"), (2, "pending")]
    assert "LOST" in (rows[0].exit_reason or "")
    assert rows[1].folder != rows[0].folder and (rows[1].folder or "").endswith("attempt-2")


def test_a_phase_past_its_wall_clock_limit_is_stopped_and_retried(settings: Settings, tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    run_id = queue(SPEC)
    _submit(run_id, settings, sleep_forever, str(marker))
    wait_for(lambda: marker.exists(), 60, "the rank to start")
    wait_for(lambda: len(marker.read_text().split()) == 2, 30, "both ranks to start")
    ranks = [int(p) for p in marker.read_text().split()]
    _reconcile(settings)
    assert phases(run_id)[0].state == "running"
    with session_scope() as session:  # pretend it started longer ago than the limit plus the grace
        phase = session.scalars(select(Phase).where(Phase.run_id == run_id)).one()
        phase.started_at = utcnow() - timedelta(days=1)
    _reconcile(settings)
    rows = phases(run_id)
    assert [(p.attempt, p.state) for p in rows] == [(1, "infra_failed"), (2, "pending")]
    assert "wall-clock" in (rows[0].exit_reason or "")
    assert not _alive(ranks), "the old attempt must be stopped before a retry exists"
    assert AttemptFolder(Path(rows[1].folder or "")).folder.name == "attempt-2"
    assert run_row(run_id).state == "train_submitted"


def test_a_rendezvous_that_finds_its_port_taken_is_retried_not_judged(settings: Settings) -> None:
    """Issue 44 row 3: a squatter held the rendezvous ports and every other tenant's run ended `error`. A real
    TCPStore bind failing with EADDRINUSE before training started is the node's failure: the attempt is
    retried, and the run is never evaluated on it; a build's own failure in the same stage still is."""
    pytest.importorskip("torch")
    squatted, broken = queue(SPEC), queue(SPEC)
    _submit(squatted, settings, fail_rendezvous, phase_doc("train_and_save"))
    own = {**phase_doc("train_and_save"), "status": "error",
           "error": {"type": "ModuleNotFoundError", "message": "No module named 'megatron'", "traceback": "",
                     "stage": "import", "rank": 0}}
    _submit(broken, settings, write_document, own)
    wait_for(lambda: _job_done(squatted) and _job_done(broken), 120, "both jobs to finish")
    _reconcile(settings)
    assert [(p.attempt, p.state) for p in phases(squatted)] == [(1, "infra_failed"), (2, "pending")]
    run = run_row(squatted)
    assert run.state == "train_submitted" and run.verdict is None, (run.state, run.error_message)
    with session_scope() as session:
        why = session.scalars(select(PhaseEvent.reason).where(
            PhaseEvent.run_id == squatted, PhaseEvent.to_state == "infra_failed")).one()
    assert "rendezvous failed in stage import" in why and "EADDRINUSE" in why.upper(), why
    assert run_row(broken).state == "evaluating"  # the build's own import error: judged, as before
