"""Submitter: claim queued runs and pending phases with FOR UPDATE SKIP LOCKED and launch them.

A phase row is written (state pending, its attempt folder fixed) and committed before anything is
submitted. Two records then make a submission idempotent, whichever replica or restart finds the
row: submitit's `<id>_submitted.pkl` in the folder, and, for Slurm, the job name, which names run,
phase and attempt, so a job whose submission was cut short between sbatch and that file is found
by name and adopted, never submitted twice.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection
from datetime import timedelta
from pathlib import Path
from typing import cast

from sqlalchemy import func, or_, select, true
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.orm import Session

from jobs.contract import PhaseName
from jobs.protocol import PHASES, Payload, RunPlan
from jobs.run_folder import AttemptFolder, RunFolder
from models import Environment, Phase, Run
from models.base import utcnow
from service.core.checks import BACKGROUND_LABELS, is_background
from service.core.phase_state import PHASE_ACTIVE, PhaseState, move_phase, record_new_phase
from service.core.run_state import IN_FLIGHT, RunState
from service.core.settings import Settings
from service.executors import job_home, job_leases, job_user, launcher, pool, slurm_jobs
from service.runs import pool_dispatch
from service.runs.lifecycle import transition

log = logging.getLogger(__name__)
SUBMITTED_STATE: dict[str, RunState] = {"train_and_save": RunState.TRAIN_SUBMITTED, "resume": RunState.RESUME_SUBMITTED}


def run_folder_of(settings: Settings, run_id: int) -> RunFolder:
    """Where one run's attempts (logs, documents, checkpoints, submitit folders) live."""
    return RunFolder(settings.resolved_run_folder / f"run-{run_id}")


def job_name(settings: Settings, phase: Phase) -> str:
    """The Slurm job name of a phase attempt: this installation's tag, run, phase, attempt.

    The tag (a hash of the run folder) keeps two installations sharing one Slurm, whose run ids
    repeat, from ever adopting each other's jobs.
    """
    tag = hashlib.sha1(str(settings.resolved_run_folder.resolve()).encode()).hexdigest()[:8]
    return f"parity-{tag}-r{phase.run_id}-{phase.name}-a{phase.attempt}"


def new_phase(
    session: Session, *, run: Run, name: str, attempt: int, settings: Settings, executor: str, delay_s: float = 0
) -> Phase:
    """Add a pending phase row whose attempt folder is fixed now, before any submission."""
    folder = run_folder_of(settings, run.id).attempt(name, attempt).folder
    phase = Phase(
        run_id=run.id, name=name, attempt=attempt, state=PhaseState.PENDING.value, executor=executor,
        folder=str(folder), job_folder=str(AttemptFolder(folder).submitit), info={}, log_paths=[],
    )
    if delay_s:
        phase.not_before = utcnow() + timedelta(seconds=delay_s)
    session.add(phase)
    session.flush()
    record_new_phase(session, phase, f"attempt {attempt} queued" + (f", not before {delay_s:.0f}s" if delay_s else ""))
    return phase


def retry_or_give_up(
    session: Session, *, phase: Phase, run: Run, what: str, settings: Settings, executor: str
) -> None:
    """After an infrastructure failure of a phase: queue the next attempt with backoff, or end in error."""
    if phase.attempt <= settings.max_infra_retries:
        delay = settings.retry_backoff_seconds * (2 ** (phase.attempt - 1))
        new_phase(session, run=run, name=phase.name, attempt=phase.attempt + 1, settings=settings,
                  executor=executor, delay_s=delay)
        transition(
            session, run, SUBMITTED_STATE[phase.name],
            f"{phase.name}: {what}; retry {phase.attempt}/{settings.max_infra_retries} in {delay:.0f}s",
        )
        return
    run.error_message = (
        f"{phase.name}: {what} on {phase.attempt} attempt(s); infrastructure failure, not a parity result"
    )
    transition(session, run, RunState.ERROR, run.error_message)  # its streak alert: ON_FINISHED (runs/lifecycle.py)


# Background work (self-tests, scheduled track runs) yields to user work: never claimed or launched
# ahead of a user's run, at most PARITY_BACKGROUND_MAX_RUNNING of its runs in flight, on the local
# executor only in slots user work leaves free, on Slurm with a `--nice` (settings.py).
IS_BACKGROUND = Run.labels.has_any(array(BACKGROUND_LABELS))


def claim_queued(session: Session, *, settings: Settings, executor: str, limit: int = 20) -> int:
    """Turn up to `limit` queued runs into pending train_and_save phases, user runs first. Returns how many."""
    # A run waits in the queue while the environment it names is still being built.
    ready = (select(Run).join(Environment, Run.environment_id == Environment.id)
             .where(Run.state == RunState.QUEUED.value, Environment.state == "ready")
             .order_by(Run.id).with_for_update(of=Run, skip_locked=True))
    runs = list(session.scalars(ready.where(~IS_BACKGROUND).limit(limit)))
    room = min(limit - len(runs), settings.background_max_running - background_in_flight(session))
    if room > 0:
        runs += session.scalars(ready.where(IS_BACKGROUND).limit(room))
    for run in runs:
        new_phase(session, run=run, name=PHASES[0], attempt=1, settings=settings, executor=executor)
        transition(session, run, RunState.TRAIN_SUBMITTED, "claimed by scheduler")
    return len(runs)


def background_in_flight(session: Session) -> int:
    """Background runs claimed and not yet finished (their phases pending, submitted or running)."""
    return session.scalar(select(func.count()).select_from(Run).where(
        IS_BACKGROUND, Run.state.in_([s.value for s in IN_FLIGHT]))) or 0


def local_slots(session: Session, settings: Settings, *, background: bool = True) -> int:
    """How many more local phase jobs of background (or user) work may start now.

    User work has PARITY_LOCAL_MAX_RUNNING slots whatever background work runs (it yields, and
    claim_queued caps how much of it is in flight); background work only the slots nothing runs in.
    """
    active = (select(func.count()).select_from(Phase).join(Run, Run.id == Phase.run_id)
              .where(Phase.executor == "local", Phase.state.in_([s.value for s in PHASE_ACTIVE])))
    running = session.scalar(active if background else active.where(~IS_BACKGROUND)) or 0
    return max(0, settings.local_max_running - running)


def next_pending(session: Session, skip: Collection[int] = (), *, background: bool | None = None) -> Phase | None:
    """The pending phase of the oldest run whose time has come, user work first (or only user work,
    background=False; only background work, True), row-locked (skipping ones another replica holds, and
    `skip`: those this tick already left waiting for a warm worker).

    By run, then phase: a run's resume (its row made when its save ended) goes before the first phase of a
    run queued after it, so a check that has started finishes first. A suite's resharded resume ran last
    otherwise, behind every later check, while its own warm worker idled towards its idle limit.
    """
    now = utcnow()
    which = true() if background is None else IS_BACKGROUND if background else ~IS_BACKGROUND
    return session.scalar(
        select(Phase).join(Run, Run.id == Phase.run_id)
        .where(Phase.state == PhaseState.PENDING.value, or_(Phase.not_before.is_(None), Phase.not_before <= now),
               which, Phase.id.not_in(list(skip)) if skip else true())
        .order_by(IS_BACKGROUND.asc(), Phase.run_id, Phase.id).limit(1).with_for_update(of=Phase, skip_locked=True)
    )


def launch(
    session: Session, phase: Phase, *, settings: Settings, executor: str, waits: pool_dispatch.TickWaits | None = None
) -> None:
    """Submit (or adopt) one pending phase with the executor this scheduler was started with.

    An attempt that PARITY_POOL covers goes to a warm worker (service/runs/pool_dispatch.py), or stays
    pending (its id added to `waits.phases`) while that key's workers start or are busy.
    """
    run = session.get(Run, phase.run_id)
    assert run is not None
    if run.cancel_requested:
        move_phase(session, phase, PhaseState.CANCELLED, "cancelled before submission")
        transition(session, run, RunState.CANCELLED, "cancelled by API before the phase was submitted")
        return
    folder = launcher_folder(phase)
    try:
        job_id = launcher.find_submitted(folder)
        if job_id is None and phase.executor == "slurm" and slurm_jobs.interrupted_submission(folder):
            job_id = _find_by_name(phase, folder, settings)
        if job_id is not None:
            log.info("phase %s of run %s already submitted as job %s; adopting it", phase.name, run.id, job_id)
            phase.job_name = job_name(settings, phase) if phase.executor == "slurm" else None
            phase.job_id = job_id
            move_phase(session, phase, PhaseState.SUBMITTED, f"adopted {phase.executor} job {job_id}")
            return
        if phase.executor != executor:
            # queued by a scheduler with another executor, and nothing was submitted from its folder
            log.info("phase %s of run %s: executor %s -> %s", phase.name, run.id, phase.executor, executor)
            phase.executor = executor
        payload = payload_of(session, run, phase, settings)
        gate, forked = _job_writes(settings, run, payload)
        warm = pool_dispatch.route(session, phase, run, settings=settings, executor=executor, entry_name=payload.entry,
                                   args=payload.args, tasks=payload.tasks, nodes=payload.nodes, job_folder=folder,
                                   hand_over=lambda worker: launcher.hand_over(
                                       settings, folder, gate=gate, also_writable=forked, worker=worker),
                                   waits=waits)
        if warm == pool_dispatch.WAIT:  # route recorded it (and its key) in waits
            return
        if isinstance(warm, launcher.PhaseJob):
            phase.job_id, phase.process_started_at = warm.job_id, warm.started
            move_phase(session, phase, PhaseState.SUBMITTED,
                       f"warm: {phase.job_name} ({warm.executor} job {warm.job_id})")
            return
        job = _submit(session, phase, run, folder, settings)
    except job_leases.NoFreeJobUser as exc:  # every job user serves a live job: wait for one, like a busy pool
        log.info("phase %s of run %s waits: %s", phase.name, run.id, exc)
        if waits is not None:
            waits.phases.add(phase.id)
        return
    except Exception as exc:  # sbatch refused, Slurm unreachable, the executor broke: not the code under test
        reason = " ".join(str(exc).split())[-1500:] or type(exc).__name__
        log.warning("submitting phase %s of run %s failed: %s", phase.name, run.id, reason)
        move_phase(session, phase, PhaseState.INFRA_FAILED, f"submission failed: {reason}")
        release_folders(settings, phase)
        retry_or_give_up(session, phase=phase, run=run, what=f"submission failed ({reason})", settings=settings,
                         executor=executor)
        return
    phase.job_id, phase.job_name, phase.process_started_at = job.job_id, job_name(settings, phase), job.started
    move_phase(session, phase, PhaseState.SUBMITTED, f"{phase.executor} job {job.job_id}")


def plan_of(run: Run) -> RunPlan:
    """The run's plan (jobs/protocol.py): its phases, their tasks, the isolation, each attempt's payload."""
    return RunPlan.of(run.spec)


def payload_of(session: Session, run: Run, phase: Phase, settings: Settings) -> Payload:
    """The job that runs this phase attempt; a resume loads the checkpoint of the attempt that saved it."""
    checkpoint_attempt = _saved_attempt(session, run) if phase.name == PHASES[1] else phase.attempt
    return plan_of(run).payload(
        run_folder_of(settings, run.id).root, cast(PhaseName, phase.name), phase.attempt, checkpoint_attempt
    )


def _submit(session: Session, phase: Phase, run: Run, folder: Path, settings: Settings) -> launcher.PhaseJob:
    env = session.get(Environment, run.environment_id)
    assert env is not None
    payload = payload_of(session, run, phase, settings)
    gate, forked = _job_writes(settings, run, payload)
    return launcher.submit_phase(launcher.JobRequest(
        executor=phase.executor, folder=folder, python=env.python, tasks=payload.tasks,
        name=job_name(settings, phase), function=payload.function(), args=payload.args,
        nodes=payload.nodes, gate=gate, also_writable=forked,
        nice=settings.background_slurm_nice if is_background(run.labels) else 0,
        gpus_per_node=payload.gpus_per_node,
    ), settings)


def _job_writes(settings: Settings, run: Run, payload: Payload) -> tuple[Path, tuple[Path, ...]]:
    """The run's folder (the gate its job passes) and the other attempt folders the job writes: a job
    that forks the resume writes that attempt's folder too (resume attempt 1, jobs/protocol.py)."""
    run_folder = run_folder_of(settings, run.id)
    return run_folder.root, tuple(run_folder.attempt(name, 1).folder for name in payload.phases[1:])


def release_folders(settings: Settings, phase: Phase, *, job_continues: bool = False) -> None:
    """A phase attempt has ended: its folder (and a forked resume's job folder) is the service's again,
    and no job passes through the run's folder any more (service/executors/job_user.py).

    job_continues: the same job goes on with the next phase (isolation "process"): its submitit
    folder stays the job's, and the run's folder stays open to it. Otherwise whatever the job left
    running (a daemon) is killed first (a local job's cgroup, every process of the job's own user:
    launcher.end_job), and once its folders are taken back that user serves the next job (job_leases).
    """
    ends = not job_continues and not pool.is_warm(phase.job_name)
    if ends and phase.job_id:
        launcher.end_job(launcher.PhaseJob(executor=phase.executor, folder=str(launcher_folder(phase)),
                                           job_id=phase.job_id, tasks=1), settings)
    try:
        _take_back_folders(settings, phase, job_continues=job_continues)
    finally:
        if ends:
            job_leases.release(settings, launcher_folder(phase).parent)


def _take_back_folders(settings: Settings, phase: Phase, *, job_continues: bool) -> None:
    try:
        run_as = job_user.job_user(settings.job_user)
    except job_user.JobUserError as exc:  # nothing was handed over under a user that does not resolve
        log.warning("not taking back %s: %s", phase.folder, exc)
        return
    if run_as is None or not phase.folder:
        return
    root = settings.resolved_run_folder
    attempt = Path(phase.folder)
    # the job goes on: its submitit folder and its private HOME/TMPDIR stay its own
    keep = (AttemptFolder(attempt).submitit, attempt / job_home.PRIVATE) if job_continues else ()
    job_user.take_back(attempt, run_as, root=root, keep=keep)
    if phase.job_folder and not job_continues:  # a forked resume: the saver's job folder is done too
        job_user.take_back(Path(phase.job_folder).parent, run_as, root=root)
    if phase.name == PHASES[0] and not job_continues:  # a resume it would have forked, never started
        job_user.take_back(run_folder_of(settings, phase.run_id).attempt(PHASES[1], 1).folder, run_as, root=root)
    if not job_continues:
        job_user.close_gate(run_folder_of(settings, phase.run_id).root, run_as)


def launcher_folder(phase: Phase) -> Path:
    """submitit's folder of the job that runs a phase attempt (a forked resume shares its saver's)."""
    return Path(phase.job_folder) if phase.job_folder else AttemptFolder(Path(phase.folder or "")).submitit


def job_of(phase: Phase, run: Run) -> launcher.PhaseJob:
    """The launcher's handle of a submitted phase."""
    return launcher.PhaseJob(
        executor=phase.executor, folder=str(launcher_folder(phase)), job_id=phase.job_id or "",
        tasks=plan_of(run).tasks(phase.name), started=phase.process_started_at,
    )


def _find_by_name(phase: Phase, folder: Path, settings: Settings) -> str | None:
    found = slurm_jobs.find_slurm_job(job_name(settings, phase), phase.created_at - timedelta(minutes=1))
    if found is None:
        return None
    job_id, state = found
    if state not in slurm_jobs.LIVE_STATES and state != "COMPLETED":
        # it waited for its pickle in vain, or was stopped: nothing to adopt, retry as infrastructure
        raise RuntimeError(f"Slurm job {job_id} found by name {job_name(settings, phase)} already ended {state}")
    log.warning("phase %s of run %s: found Slurm job %s (%s) by name with no record in %s",
                phase.name, phase.run_id, job_id, state, folder)
    slurm_jobs.adopt_slurm_job(folder, job_id)
    return job_id


def _saved_attempt(session: Session, run: Run) -> int:
    """The attempt of train_and_save whose checkpoint the resume phase loads (the one that succeeded)."""
    attempt = session.scalar(
        select(Phase.attempt).where(Phase.run_id == run.id, Phase.name == PHASES[0],
                                    Phase.state == PhaseState.SUCCEEDED.value)
        .order_by(Phase.id.desc()).limit(1)
    )
    return attempt or 1
