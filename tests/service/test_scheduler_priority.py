"""User work goes first: a fresh service's self-test batch yields to a check submitted right after start-up.

A real scheduler process (local executor, one slot) with its detector-health batch on: its first tick
queues the whole catalogue; a user's check queued just after is claimed and started while the batch
waits, and no more than PARITY_BACKGROUND_MAX_RUNNING self-test runs are ever in flight.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from jobs.selftest.catalogue import health_specs
from models import Phase, Run
from service.core.db import session_scope
from service.core.run_state import IN_FLIGHT
from service.runs.records import cancel_run
from service.scheduler.submitter import IS_BACKGROUND
from tests.plugins.scheduler_harness import GOOD, phases, queue, run_row, service_env, start, stop, wait_for

pytestmark = [pytest.mark.megatron]  # the one background run it lets start trains for real
SMALL = {"config": "moe-fp32-router", "dp": 2, "steps": 8, "save_step": 4, "workarounds": GOOD}
STARTED = ("submitted", "running", "succeeded")


def _background() -> tuple[int, int]:
    """(background runs queued in all, of them claimed and not finished)."""
    with session_scope() as session:
        total = session.scalar(select(func.count()).select_from(Run).where(IS_BACKGROUND)) or 0
        in_flight = session.scalar(select(func.count()).select_from(Run).where(
            IS_BACKGROUND, Run.state.in_([s.value for s in IN_FLIGHT]))) or 0
    return total, in_flight


def _user_started(run_id: int) -> bool:
    return any(p.state in STARTED and p.job_id for p in phases(run_id))


def _cancel_all() -> None:
    with session_scope() as session:
        ids = session.scalars(select(Run.id).where(Run.state.in_(["queued", *(s.value for s in IN_FLIGHT)]))).all()
    for run_id in ids:
        with session_scope() as session:
            cancel_run(session, run_id=run_id)


def _cancel_all_then_stop(scheduler: subprocess.Popen[bytes]) -> None:
    """Cancel every unfinished run, let the scheduler end their jobs, then stop it."""
    _cancel_all()
    try:
        wait_for(_nothing_in_flight, 120, "the cancelled runs' jobs to end", alive=[scheduler])
    finally:
        stop(scheduler)


def _nothing_in_flight() -> bool:
    with session_scope() as session:
        return not session.scalar(select(func.count()).select_from(Phase).where(
            Phase.state.in_(["pending", "submitted", "running"])))


def test_a_check_submitted_at_start_up_starts_before_the_self_test_batch(committed_db: str, tmp_path: Path) -> None:
    catalogue = len(health_specs())
    env = service_env(tmp_path, PARITY_EXECUTOR="local", PARITY_SELFTEST_INTERVAL_HOURS="24",
                      PARITY_LOCAL_MAX_RUNNING="1", PARITY_BACKGROUND_MAX_RUNNING="1")
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        # the first tick queues the whole batch (the service was idle)
        wait_for(lambda: _background()[0] == catalogue, 120, "the self-test batch", alive=[scheduler])
        user = queue(SMALL, labels={"branch": "main"})
        wait_for(lambda: _user_started(user), 300, "the user's check to start", alive=[scheduler])
        total, in_flight = _background()
        # the user's job started while the batch waits: at most one self-test run was let in ahead of it
        # (it had the free slot when nothing else was queued), the rest still queued behind it
        assert total == catalogue and in_flight <= 1, (total, in_flight)
        assert run_row(user).state != "queued"
        with session_scope() as session:
            queued = session.scalar(select(func.count()).select_from(Run).where(IS_BACKGROUND, Run.state == "queued"))
        assert queued is not None and queued >= catalogue - 1
        # the one background run never took the user's slot: the user's phase runs beside it
        user_phase = phases(user)[0]
        with session_scope() as session:
            earlier = session.scalar(select(func.count()).select_from(Phase).join(Run, Run.id == Phase.run_id).where(
                IS_BACKGROUND, Phase.id < user_phase.id))
        assert (earlier or 0) <= 1
    finally:
        _cancel_all_then_stop(scheduler)


def _nice(job_id: str) -> int:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"\bNice=(-?\d+)", shown).group(1))  # type: ignore[union-attr]


@pytest.mark.slurm
def test_on_slurm_background_jobs_are_submitted_nice_and_user_jobs_not(
    committed_db: str, slurm: str, tmp_path: Path
) -> None:
    # held jobs never start: what is looked at is the priority each was submitted with
    env = service_env(tmp_path, PARITY_EXECUTOR="slurm", PARITY_SLURM_EXTRA_ARGS="hold",
                      PARITY_BACKGROUND_SLURM_NICE="500")
    background = queue(SMALL, labels={"selftest": "detector-health"})
    user = queue(SMALL, labels={"branch": "main"})
    scheduler = start(["scheduler"], env, tmp_path / "scheduler.log")
    try:
        wait_for(lambda: all(any(p.job_id for p in phases(r)) for r in (background, user)), 120,
                 "both runs' jobs submitted", alive=[scheduler])
        jobs = {r: next(p.job_id for p in phases(r) if p.job_id) for r in (background, user)}
        assert _nice(str(jobs[background])) == 500
        assert _nice(str(jobs[user])) == 0
    finally:
        _cancel_all_then_stop(scheduler)
