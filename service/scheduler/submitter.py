"""Submitter: claim queued runs and pending phases with FOR UPDATE SKIP LOCKED and launch them.

A phase row is written (state pending, its submitit folder fixed) and committed before anything is
submitted; the folder then doubles as the idempotency record: a phase whose folder already holds a
submitted job is adopted, never submitted again, whichever replica or restart finds it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from jobs.contract import PhaseName
from jobs.rank.entry import run_rank_phase
from models import Environment, Phase, Run
from models.base import utcnow
from service.scheduler import launcher
from service.settings import Settings
from service.slurm import pick_executor
from service.state import RunState, transition

log = logging.getLogger(__name__)
# The phases the service runs, in order (the benchmark's "uninterrupted" phase is not one of them).
PHASES: tuple[PhaseName, PhaseName] = ("train_and_save", "resume")
SUBMITTED_STATE: dict[str, RunState] = {"train_and_save": RunState.TRAIN_SUBMITTED, "resume": RunState.RESUME_SUBMITTED}


def run_dir(settings: Settings, run_id: int) -> Path:
    """Where one run's checkpoints, probes and job folders live."""
    return settings.resolved_run_folder / f"run-{run_id}"


def new_phase(session: Session, *, run: Run, name: str, attempt: int, settings: Settings, delay_s: float = 0) -> Phase:
    """Add a pending phase row whose submitit folder is fixed now, before any submission."""
    executor = pick_executor(settings)
    folder = run_dir(settings, run.id) / f"{name}-attempt{attempt}"
    phase = Phase(
        run_id=run.id, name=name, attempt=attempt, state="pending", executor=executor, folder=str(folder),
        info={}, log_paths=[],
    )
    if delay_s:
        from datetime import timedelta

        phase.not_before = utcnow() + timedelta(seconds=delay_s)
    session.add(phase)
    session.flush()
    return phase


def retry_or_give_up(session: Session, *, phase: Phase, run: Run, what: str, settings: Settings) -> None:
    """After an infrastructure failure of a phase: queue the next attempt with backoff, or end in error."""
    if phase.attempt <= settings.max_infra_retries:
        delay = settings.retry_backoff_seconds * (2 ** (phase.attempt - 1))
        new_phase(session, run=run, name=phase.name, attempt=phase.attempt + 1, settings=settings, delay_s=delay)
        transition(
            session, run, SUBMITTED_STATE[phase.name],
            f"{phase.name}: {what}; retry {phase.attempt}/{settings.max_infra_retries} in {delay:.0f}s",
        )
        return
    run.error_message = (
        f"{phase.name}: {what} on {phase.attempt} attempt(s); infrastructure failure, not a parity result"
    )
    transition(session, run, RunState.ERROR, run.error_message)


def claim_queued(session: Session, *, settings: Settings, limit: int = 20) -> int:
    """Turn up to `limit` queued runs into pending train_and_save phases. Returns how many."""
    runs = session.scalars(
        select(Run).where(Run.state == RunState.QUEUED.value).order_by(Run.id).limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    for run in runs:
        new_phase(session, run=run, name=PHASES[0], attempt=1, settings=settings)
        transition(session, run, RunState.TRAIN_SUBMITTED, "claimed by scheduler")
    return len(runs)


def launch_one(session: Session, *, settings: Settings) -> bool:
    """Submit (or adopt) one pending phase whose time has come. False when there is none."""
    now = utcnow()
    phase = session.scalar(
        select(Phase).where(Phase.state == "pending", or_(Phase.not_before.is_(None), Phase.not_before <= now))
        .order_by(Phase.id).limit(1).with_for_update(skip_locked=True)
    )
    if phase is None:
        return False
    run = session.get(Run, phase.run_id)
    assert run is not None
    if run.cancel_requested:
        phase.state = "cancelled"
        phase.exit_reason = "cancelled before submission"
        transition(session, run, RunState.CANCELLED, "cancelled by API before the phase was submitted")
        return True
    folder = Path(phase.folder or "")
    job_id = launcher.find_submitted(folder)
    if job_id is None:
        env = session.get(Environment, run.environment_id)
        assert env is not None
        try:
            job = launcher.submit_phase(
                executor=phase.executor, folder=folder, python=env.python, tasks=int(run.spec["dp"]),
                settings=settings, name=f"parity-{run.id}-{phase.name}", function=run_rank_phase,
                args=(run.spec, str(run_dir(settings, run.id)), phase.name),
            )
        except Exception as exc:  # sbatch refused or the executor broke: the infrastructure, not the code
            reason = " ".join(str(exc).split())[-1500:] or type(exc).__name__
            log.warning("submitting phase %s of run %s failed: %s", phase.name, run.id, reason)
            phase.state, phase.ended_at, phase.exit_reason = "infra_failed", now, f"submission failed: {reason}"
            retry_or_give_up(session, phase=phase, run=run, what=f"submission failed ({reason})", settings=settings)
            return True
        job_id = job.job_id
    else:
        log.info("phase %s of run %s already submitted as job %s; adopting it", phase.name, run.id, job_id)
    phase.job_id = job_id
    phase.state = "submitted"
    phase.submitted_at = now
    return True
