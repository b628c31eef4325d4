"""The warm pool against the real scheduler, real Megatron-Core, and real Slurm (and the local executor).

One scheduler and one pool per executor carry every check in sequence, so the imports are paid by
a couple of workers, not by every case: a warm run writes the same phase documents as a cold run
of the same spec (timings and paths aside; the cold reference is run-local's documents of that spec,
made once per session and shared with tests/service/test_protocol_equality.py, which shows the
scheduler's cold run writes exactly those), a run
cancelled while warm ends cancelled and its worker goes back to idle and serves the next run, a
worker task SIGKILLed mid-run and a worker allocation ended from outside both hand their attempt
back as an infrastructure retry that still ends in the right verdict, and the idle pool shrinks to
zero (no worker job left). CI walks all of it on Slurm and, as the job user, the local executor's own
part (the warm run, an allocation ended, the idle shrink); the nightly run walks it all locally too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobs.pool_folder import PoolFolder, read_pool_file
from jobs.protocol import RunPlan
from models import Phase
from service.core.db import session_scope
from service.runs.records import cancel_run
from tests.plugins.documents import comparable, differences
from tests.plugins.job_faults import plugin_folder, with_plugin
from tests.plugins.job_user import JOB_USER, require_job_user
from tests.plugins.run_local import PHASES, LocalReference
from tests.plugins.scheduler_harness import (
    GOOD,
    live_workers,
    phases,
    queue,
    register_environment,
    run_row,
    service_env,
    start,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.megatron, pytest.mark.postgres, pytest.mark.timeout(1200)]
SAME = {"config": "moe-fp32-router", "dp": 2, "steps": 5, "save_step": 2, "workarounds": GOOD,
        "isolation": "process"}  # test_protocol_equality's "process" case: one run-local reference for both
# an attempt a fault strikes: it holds after HOLD_STEP until the test has struck (tests/plugins/job_faults.py), so
# the fault always lands mid-run (raced against the attempt, it once landed after the last document and
# struck nothing, three times in a row); the runs before reach no such step
LONG = {**SAME, "steps": 20, "save_step": 10}
HOLD_STEP = 12
IDLE_S = 20


def _workers(runs: Path) -> list[PoolFolder]:
    root = runs / "pool"
    return [PoolFolder(p) for p in sorted(root.iterdir()) if PoolFolder(p).record.exists()] if root.is_dir() else []


def _busy_with(runs: Path, run_id: int) -> tuple[PoolFolder, Phase] | None:
    """The worker whose order is this run's attempt, once every task has taken it up and before the
    attempt has written its documents, and that attempt.

    Which phase it is depends on the machine's speed (a fast train_and_save can end between two polls),
    so the caller asserts on the attempt returned here, not on a phase named in advance."""
    plan = RunPlan.of(run_row(run_id).spec)
    # an attempt whose ranks all wrote their documents is done, whatever its row and the beats still say
    # (the reconciler has not seen them yet, the child is exiting): a fault now would strike nothing
    attempts = [p for p in phases(run_id) if p.job_name and p.state in ("submitted", "running")
                and not plan.finished(Path(p.folder or "."), p.name)]
    for w in live_workers(runs):
        order = w.read_order()
        beats = w.beats(2)
        if not order or not all(b and b.get("state") == "busy" for b in beats):
            continue
        for attempt in attempts:
            if str(order.get("id")) in (attempt.job_name or ""):
                return w, attempt
    return None


def _warm_phases(run_id: int) -> list[Phase]:
    return [p for p in phases(run_id) if (p.job_name or "").startswith("pool:")]


def _kill_task(worker: PoolFolder) -> None:
    """SIGKILL rank 0's task and everything it forked (its attempt child and the phase children)."""
    beat = read_pool_file(worker.heartbeat(0))
    assert beat is not None
    task = psutil.Process(int(beat["pid"]))
    for proc in [task, *task.children(recursive=True)]:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def _end_allocation(worker: PoolFolder, executor: str) -> None:
    record = read_pool_file(worker.record)
    assert record is not None and record["job_id"]
    if executor == "slurm":
        # SIGKILL to the batch shell and every step at once, as a lost node: a plain scancel sends
        # SIGTERM first, which submitit ignores, so a short attempt could finish in Slurm's KillWait
        # and the fault would strike nothing
        subprocess.run(["scancel", "--signal=KILL", "--full", str(record["job_id"])], check=True)
    else:  # the local worker's controller leads its own process group: end the group, as a lost node would
        os.killpg(int(record["job_id"]), signal.SIGKILL)


def _documents(run_id: int) -> dict[str, dict]:
    return {p.name: p.info for p in phases(run_id) if p.state == "succeeded"}


# The local walk's own paths are the job user (its workers' tasks, the files it may not rewrite) and an
# allocation ended by ending the controller's process group: CI walks those (walk="job-user"); the
# cancel and the killed task, walked on Slurm in CI, walk locally too in the nightly full walk.
@pytest.mark.parametrize(("executor", "walk"), [
    pytest.param("slurm", "full", marks=pytest.mark.nightly),
    pytest.param("local", "job-user", marks=pytest.mark.nightly),  # the PR tier: test_protocol_equality's warm suite
    pytest.param("local", "full", marks=pytest.mark.nightly),
])
def test_warm_pool_matches_cold_and_survives_its_faults(
    committed_db: str, slurm: str, tmp_path: Path, executor: str, walk: str,
    run_local_reference: Callable[[dict[str, Any]], LocalReference],
) -> None:
    runs = tmp_path / "runs"
    as_job_user: dict[str, str] = {}
    if executor == "local":  # the local variant runs every job, warm and cold, as PARITY_JOB_USER
        require_job_user()
        base = Path("/var/tmp") / f"parity-pool-{uuid.uuid4().hex[:8]}"  # pytest's tmp is root-only (0700)
        base.mkdir(mode=0o711)
        runs = base / "runs"
        as_job_user = {"PARITY_JOB_USER": JOB_USER, "PARITY_RUN_FOLDER": str(runs)}
    register_environment("pooled", sys.executable)
    holds = (runs.parent if as_job_user else tmp_path) / "holds"  # passable for a job user, writable by us only
    holds.mkdir(mode=0o755)
    release = holds / "release"
    release.touch()  # nothing holds until a fault is about to strike
    # the hold comes from a test-only plugin on the jobs' PYTHONPATH (tests/plugins/job_faults.py), beside it
    env = with_plugin(service_env(tmp_path, PARITY_EXECUTOR=executor, PARITY_LOCAL_MAX_RUNNING="2",
                                  PARITY_POOL=f"env=pooled:tasks=2:size=1:idle={IDLE_S}:hang=10", **as_job_user),
                      plugin_folder(holds / "plugin", hold=f"{HOLD_STEP}:{release}"))
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    alive = [scheduler]
    try:
        # warm and cold, same spec: identical phase documents (timings, paths, ids aside)
        warm = queue(SAME, environment="pooled")
        cold = run_local_reference(SAME)  # made while the first worker starts (or already, by the other variant)
        wait_for(lambda: run_row(warm).finished_at, 600, "the warm run", alive=alive)
        assert cold.verdict == run_row(warm).verdict == "pass", (run_row(warm).error_message,)
        assert {p.name for p in _warm_phases(warm)} == {"train_and_save", "resume"}
        warm_docs = _documents(warm)
        for phase in PHASES:
            assert list(differences(comparable(warm_docs[phase]), comparable(cold.document(phase)))) == [], phase
        first_worker = {w.name for w in live_workers(runs)}
        assert len(first_worker) == 1
        if as_job_user:  # the worker's tasks run as a job user of its own, and its record is not theirs to rewrite
            (worker_files,) = live_workers(runs)
            beat = read_pool_file(worker_files.heartbeat(0))
            assert beat is not None
            worker_user = pwd.getpwuid(psutil.Process(int(beat["pid"])).uids().real).pw_name
            assert worker_user.startswith(f"{JOB_USER}-"), worker_user  # leased from the pool (job_leases)
            assert worker_files.record.stat().st_uid == os.geteuid()

        # cancel while warm: the run ends cancelled, the same worker goes back to idle and serves again
        full = walk == "full"
        if full:
            cancelled = queue(LONG, environment="pooled")
            wait_for(lambda: _busy_with(runs, cancelled), 300, "the run busy on a warm worker", 0.1, alive)
            with session_scope() as session:
                cancel_run(session, run_id=cancelled)
            wait_for(lambda: run_row(cancelled).finished_at, 120, "the cancel", alive=alive)
            assert run_row(cancelled).state == "cancelled"
            after = queue(SAME, environment="pooled")
            wait_for(lambda: run_row(after).finished_at, 300, "the run after the cancel", alive=alive)
            assert run_row(after).verdict == "pass"
            assert {p.job_name.split(":")[1] for p in _warm_phases(after)} == first_worker  # type: ignore[union-attr]

        # a worker task SIGKILLed mid-run, then a worker allocation ended: each an infrastructure retry
        for fault in ("task killed", "allocation ended") if full else ("allocation ended",):
            release.unlink()
            run_id = queue(LONG, environment="pooled")
            # the attempt holds mid-run (after step HOLD_STEP, both ranks): the fault cannot come too late
            wait_for(partial(_held, run_id), 300, "the attempt to hold mid-run", 0.1, alive)
            worker, hit = wait_for(partial(_busy_with, runs, run_id), 60, "a busy worker", 0.1, alive)
            held = _held_ranks(run_id)
            assert len(held) == 2, held
            if fault == "task killed":
                _kill_task(worker)  # SIGKILL, delivered before kill(2) returns
            else:
                _end_allocation(worker, executor)
                # scancel only asks slurmctld: its SIGKILL reaches the tasks later, and a hold released before
                # then let the attempt run through and the fault strike nothing (a red nightly). The fault is
                # the allocation's end: wait for it (every held rank dead) before the hold is released.
                wait_for(partial(_all_dead, held), 120, f"the held ranks to die ({fault})", 0.1, alive)
            release.touch()  # the retry runs through
            wait_for(partial(_finished, run_id), 600, f"the run after {fault}", alive=alive)
            row, attempts = run_row(run_id), phases(run_id)
            assert row.verdict == "pass", (fault, row.state, row.error_message)
            # One order runs both phases, and the worker may already be in resume while train_and_save's
            # row still reads running: the attempt the fault ended is the one handed back, whichever it was
            seen = [(p.name, p.attempt, p.state) for p in attempts]
            struck = [p for p in attempts if p.state == "infra_failed"]
            assert struck and struck[0].attempt == 1 and struck[0].name in (hit.name, "resume"), (fault, hit.name, seen)
            assert any(p.name == struck[0].name and p.attempt == 2 and p.state == "succeeded" for p in attempts), seen
            assert worker.retired.exists(), fault  # never handed another order

        # idle: the pool shrinks to zero, its worker jobs gone
        wait_for(lambda: not live_workers(runs), IDLE_S + 90, "the idle pool to shrink to zero", alive=alive)
        if as_job_user:  # every job gone, every job user given back, nothing left running as one
            wait_for(lambda: not _leases(runs), 120, "every job user to be given back", alive=alive)
            uid = pwd.getpwnam(worker_user).pw_uid
            assert not [p.pid for p in psutil.process_iter(["uids", "status"]) if p.info["uids"]
                        and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]
        if executor == "slurm":
            ids = {str((read_pool_file(w.record) or {}).get("job_id")) for w in _workers(runs)}
            wait_for(lambda: not ids & set(_squeue()), 120, "the pool jobs to leave the queue")
    finally:
        stop(scheduler)
        _stop_leftovers(runs, executor)
        if as_job_user:
            shutil.rmtree(runs.parent, ignore_errors=True)


def _finished(run_id: int) -> object:
    return run_row(run_id).finished_at


def _held(run_id: int) -> bool:
    """Whether every rank of one of the run's live attempts holds after HOLD_STEP (jobs/rank/context.py)."""
    return any(len(list(Path(p.folder).glob("held.rank*"))) == 2 for p in phases(run_id)
               if p.folder and p.state in ("submitted", "running"))


def _held_ranks(run_id: int) -> list[psutil.Process]:
    """The rank processes holding after HOLD_STEP (each wrote its pid in held.rank<r>), as they are now."""
    procs = []
    for p in phases(run_id):
        if p.folder and p.state in ("submitted", "running"):
            for held in Path(p.folder).glob("held.rank*"):
                try:
                    procs.append(psutil.Process(int(held.read_text())))
                except (ValueError, psutil.NoSuchProcess):
                    pass
    return procs


def _all_dead(procs: list[psutil.Process]) -> bool:
    """Whether every one of procs has ended (is_running also tells a reused pid from the process)."""
    def dead(proc: psutil.Process) -> bool:
        try:
            return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    return all(dead(p) for p in procs)


def _leases(runs: Path) -> list[str]:
    """The pool users leased to folders under `runs` (the lease folder is the host's, shared)."""
    from service.core.settings import Settings
    from service.executors.job_leases import holders

    return [user for user, folder in holders(Settings(job_user=JOB_USER)).items() if folder.startswith(f"{runs}/")]


def _squeue() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=False).stdout.split()


def _stop_leftovers(runs: Path, executor: str) -> None:
    """A failed test must not leave worker jobs holding the shared node."""
    for worker in _workers(runs):
        record = read_pool_file(worker.record) or {}
        if not record.get("job_id"):
            continue
        if executor == "slurm":
            subprocess.run(["scancel", str(record["job_id"])], check=False)
        else:
            try:
                os.killpg(int(record["job_id"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
