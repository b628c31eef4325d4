"""Reconciler: poll every in-flight phase in one batch and move runs along the state machines.

Infra failures (cancelled, node failure, preemption, time limit, a vanished local job, a job
pending or running past its deadline) are retried as a new attempt, in a new folder, after the old
job is cancelled, up to PARITY_MAX_INFRA_RETRIES, and never reported as parity results; a phase
that ran and returned a document (even one describing a crash) is a parity answer and is never
retried. Each phase row is handled in its own savepoint (`guard.per_row`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.contract import ErrorRecord, PhaseDocument, PhaseName, error_record, phase_document
from jobs.protocol import RunPlan
from jobs.run_folder import AttemptFolder
from models import Phase, Run
from models.base import utcnow
from service.core.phase_state import PHASE_ACTIVE, PhaseState, move_phase
from service.core.run_state import RunState
from service.core.settings import Settings
from service.executors import launcher, pool
from service.executors.job_user import folder_bytes
from service.runs.lifecycle import transition
from service.runs.phase_documents import InvalidDocument, rejected_document, validate_phase_document
from service.scheduler import row_guard as guard
from service.scheduler.submitter import (
    PHASES,
    SUBMITTED_STATE,
    job_of,
    new_phase,
    plan_of,
    release_folders,
    retry_or_give_up,
)

log = logging.getLogger(__name__)
RUNNING_STATE: dict[str, RunState] = {"train_and_save": RunState.TRAIN_RUNNING, "resume": RunState.RESUME_RUNNING}


def reconcile(session: Session, *, settings: Settings, executor: str) -> int:
    """One pass over all submitted/running/cancelling phases (row-locked, skipping ones another replica holds).

    A phase has finished when every rank's document is in its attempt folder (a stat per rank);
    sacct, rate limited in launcher.poll, only has to say which jobs ended without them. Returns
    how many phases changed state.
    """
    rows = session.execute(
        select(Phase, Run).join(Run, Run.id == Phase.run_id)
        .where(Phase.state.in_([s.value for s in PHASE_ACTIVE]))
        .order_by(Run.scheduler_failures, Phase.id).with_for_update(of=Phase, skip_locked=True)
    ).tuples().all()
    if not rows:
        return 0
    statuses = launcher.poll([job_of(phase, run) for phase, run in rows])
    changed = 0
    for phase, run in rows:
        before = phase.state
        status = statuses[job_of(phase, run)]
        if pool.is_warm(phase.job_name):  # the worker's job is alive for many orders: ask about this one
            status = pool.warm_status(settings, str(phase.job_name), status)
        step = partial(_reconcile_one, session, phase, run, status, settings, executor)
        guard.per_row(session, run, step, settings=settings, what=f"reconciling {phase.name} attempt {phase.attempt}")
        changed += phase.state != before
        if phase.state != before and phase.state not in PHASE_ACTIVE:
            # the attempt is over: its folder is the service's again (a no-op without PARITY_JOB_USER)
            continues = phase.state == PhaseState.SUCCEEDED and plan_of(run).forks_resume(phase.name)
            release_folders(settings, phase, job_continues=continues)
    return changed


def watched_files(session: Session, *, settings: Settings) -> list[Path]:
    """The rank documents whose appearance means an in-flight phase has finished (what the loop stats)."""
    rows = session.execute(
        select(Phase.folder, Phase.name, Run.spec).join(Run, Run.id == Phase.run_id)
        .where(Phase.state.in_((PhaseState.SUBMITTED.value, PhaseState.RUNNING.value)))
    ).tuples().all()
    return [path for folder, name, spec in rows for path in RunPlan.of(spec).result_paths(Path(folder or "."), name)]


def _reconcile_one(
    session: Session, phase: Phase, run: Run, status: launcher.JobStatus, settings: Settings, executor: str
) -> None:
    attempt_dir = AttemptFolder(Path(phase.folder or "."))
    cancelling = run.cancel_requested or phase.state == PhaseState.CANCELLING
    doc: PhaseDocument | None = None
    refused: list[str] = []
    if not cancelling and plan_of(run).finished(attempt_dir.folder, phase.name):
        doc, refused = plan_of(run).collect(attempt_dir.folder, phase.name)
    if cancelling:
        _cancel(session, phase, run, status, settings)
    elif over_quota := exceeded(phase, attempt_dir.folder, settings):
        _over_quota(session, phase, run, over_quota)
    elif (doc is None or doc.get("status") != "ok") and (doc is not None or refused or status.kind == "failed") and (
            at_limit := file_at_limit(attempt_dir.folder, settings)):
        _over_quota(session, phase, run, at_limit)  # an error caused by the per-file limit says so
    elif doc is not None or refused or status.kind in ("done", "failed"):
        # a FAILED job (a rank died) may still have rank 0's document: keep its evidence if so; a
        # document refused as unreadable is the job's answer too (an error), never an infra retry
        _finished(session, phase, run, settings, executor, doc, refused)
    elif status.kind == "infra":
        _infra_failure(session, phase, run, f"job {phase.job_id} ended {status.raw}", settings, executor)
    elif phase.state == PhaseState.SUBMITTED and (status.kind == "running" or attempt_dir.rank_log(0).exists()):
        move_phase(session, phase, PhaseState.RUNNING, f"{phase.executor} job {phase.job_id} running")
        if run.state == SUBMITTED_STATE[phase.name]:
            transition(session, run, RUNNING_STATE[phase.name], f"{phase.executor} job {phase.job_id} running")
    elif phase.state == PhaseState.RUNNING:
        if _past(phase.started_at, wall_limit_s(settings, phase.executor)):
            _deadline(session, phase, run, f"running past its wall-clock limit ({status.raw})", settings, executor)
    elif _past(phase.submitted_at, settings.pending_timeout_s):
        # PENDING for too long, or a state nobody can read (UNKNOWN): give the slot back and retry
        _deadline(session, phase, run, f"still {status.raw} after {settings.pending_timeout_s:.0f}s", settings,
                  executor)


def wall_limit_s(settings: Settings, executor: str) -> float:
    """How long a phase may run before the scheduler stops it: the executor's limit plus a grace."""
    limit_min = settings.slurm_time_limit_min if executor == "slurm" else settings.phase_timeout_min
    return limit_min * 60 + settings.phase_grace_s


def _past(since: object, seconds: float) -> bool:
    return since is not None and utcnow() - since > timedelta(seconds=seconds)  # type: ignore[operator]


def collect_log_paths(phase: Phase, job: launcher.PhaseJob) -> list[str]:
    """The attempt's own per-rank logs (where a caught traceback lands) first, then submitit's stdout/stderr."""
    attempt_dir = AttemptFolder(Path(phase.folder or "."))
    own = [attempt_dir.rank_log(rank) for rank in range(job.tasks)]
    return [str(p) for p in own if p.is_file()] + launcher.log_paths(job)


def _end(session: Session, phase: Phase, run: Run, state: PhaseState, reason: str) -> None:
    phase.log_paths = collect_log_paths(phase, job_of(phase, run))
    move_phase(session, phase, state, reason)


def _finished(
    session: Session, phase: Phase, run: Run, settings: Settings, executor: str, raw: PhaseDocument | None = None,
    refused: list[str] | None = None,
) -> None:
    if raw is None:
        # the job ended before every rank wrote its document: what the others wrote speaks for the
        # phase; with none, the ranks' own stderr says why (read as text, never unpickled)
        if not refused:
            raw, refused = plan_of(run).collect(Path(phase.folder or "."), phase.name)
        if raw is None:
            _job_raised(session, phase, run, "\n".join([*refused, launcher.failure_text(job_of(phase, run))]).strip())
            return
    try:
        doc = validate_phase_document(raw)
    except InvalidDocument as exc:
        # never a silent pass: the phase is an error naming the field; the raw document stays in info
        log.warning("phase %s of run %s returned an invalid document: %s", phase.name, run.id, exc)
        doc = rejected_document(run.spec, cast(PhaseName, phase.name), raw, exc)
    phase.info = cast(dict[str, Any], doc)
    info = doc["info"]
    phase.save_s, phase.load_s = info.get("save_seconds"), info.get("load_seconds")
    ok = doc["status"] == "ok"
    if not ok and (why := setup_network_failure(doc["error"])):
        # the ranks could not meet before training started: the node's, not the build's (retried)
        _infra_failure(session, phase, run, f"job {phase.job_id}: {why}", settings, executor)
        return
    _end(session, phase, run, PhaseState.SUCCEEDED if ok else PhaseState.FAILED, "" if ok else _doc_error(doc["error"]))
    if ok and plan_of(run).forks_resume(phase.name):
        _resume_in_same_job(session, phase, run, settings, executor)
    elif ok and phase.name == PHASES[0]:
        new_phase(session, run=run, name=PHASES[1], attempt=1, settings=settings, executor=executor)
        transition(session, run, RunState.RESUME_SUBMITTED, f"{phase.name} finished; resume queued")
    else:
        # both phases done, or a phase crashed inside the job: either way the evaluator decides
        transition(session, run, RunState.EVALUATING, f"{phase.name} returned {doc['status']}")


# A rendezvous that could not bind or reach its port (the review's squatter held 20000-32767, and every
# other tenant's run then ended `error`): a failure of the node before any of the build's training ran.
SETUP_STAGES = ("import", "init")
SETUP_NETWORK = re.compile(r"EADDRINUSE|address already in use|EADDRNOTAVAIL|cannot assign requested address", re.I)


def setup_network_failure(error: Any) -> str | None:
    """What failed, when a phase's error is a rendezvous network failure before training started; else None."""
    if not isinstance(error, dict) or error.get("stage") not in SETUP_STAGES:
        return None
    text = f"{error.get('type', '')}: {error.get('message', '')}"
    if not SETUP_NETWORK.search(text):
        return None
    return f"rendezvous failed in stage {error['stage']} before training started ({text[:300]})"


def _resume_in_same_job(session: Session, saved: Phase, run: Run, settings: Settings, executor: str) -> None:
    """Isolation "process": the attempt's job forks the resume child itself (as resume attempt 1); record it."""
    resume = new_phase(session, run=run, name=PHASES[1], attempt=1, settings=settings, executor=executor)
    resume.job_folder, resume.job_id, resume.executor = saved.job_folder, saved.job_id, saved.executor
    resume.job_name, resume.process_started_at = saved.job_name, saved.process_started_at
    move_phase(session, resume, PhaseState.SUBMITTED, f"forked in {saved.executor} job {saved.job_id}")
    move_phase(session, resume, PhaseState.RUNNING, f"forked in {saved.executor} job {saved.job_id}")
    transition(session, run, RunState.RESUME_SUBMITTED, f"{saved.name} finished; resume forked in the same job")
    transition(session, run, RunState.RESUME_RUNNING, f"{saved.executor} job {saved.job_id} running resume")


def _doc_error(err: ErrorRecord | None) -> str:
    if err is None:
        return "error: no error record"
    return f"{err['stage']}: {err['type']}: {err['message']}"[:2000]


def _job_raised(session: Session, phase: Phase, run: Run, error: str | None) -> None:
    """The job ended without rank 0's document (it raised, or the rank died): an error, not retried."""
    record = error_record("JobFailed", error or "", stage="job")
    phase.info = cast(
        dict[str, Any], phase_document(run.spec, cast(PhaseName, phase.name), 0, status="error", error=record)
    )
    _end(session, phase, run, PhaseState.FAILED, error or "job failed without a result")
    run.error_message = f"{phase.name} job {phase.job_id} failed: {(error or '')[-1500:]}"
    transition(session, run, RunState.EVALUATING, f"{phase.name} job raised")


def _infra_failure(session: Session, phase: Phase, run: Run, what: str, settings: Settings, executor: str) -> None:
    # the old job is stopped before a retry exists: two attempts never run side by side (a warm
    # worker that died, hung or ran out of time is stopped whole and never handed another order)
    if pool.is_warm(phase.job_name):
        pool.retire_named(settings, str(phase.job_name), what)
    else:
        launcher.cancel(job_of(phase, run))
    _end(session, phase, run, PhaseState.INFRA_FAILED, f"{phase.executor}: {what}")
    retry_or_give_up(session, phase=phase, run=run, what=what, settings=settings, executor=executor)


def _over_quota(session: Session, phase: Phase, run: Run, what: str) -> None:
    """The attempt wrote more than PARITY_RUN_DISK_QUOTA: stopped, and the run ends in error (an
    infrastructure cause, not a parity result; never retried, the same code would fill it again)."""
    log.warning("run %s: %s; cancelling %s job %s", run.id, what, phase.executor, phase.job_id)
    launcher.cancel(job_of(phase, run))
    _end(session, phase, run, PhaseState.INFRA_FAILED, what)
    run.error_message = f"{phase.name}: {what}; infrastructure failure, not a parity result"
    transition(session, run, RunState.ERROR, run.error_message)


def _deadline(session: Session, phase: Phase, run: Run, what: str, settings: Settings, executor: str) -> None:
    log.warning("run %s: %s job %s %s; cancelling it", run.id, phase.executor, phase.job_id, what)
    _infra_failure(session, phase, run, f"job {phase.job_id} {what}", settings, executor)


def _cancel(session: Session, phase: Phase, run: Run, status: launcher.JobStatus, settings: Settings) -> None:
    """Ask the executor to stop the job; the phase is cancelled only once the job is seen gone."""
    if phase.state != PhaseState.CANCELLING:
        move_phase(session, phase, PhaseState.CANCELLING, f"cancel requested from {phase.executor}")
    elif status.kind not in ("running", "active"):
        _end(session, phase, run, PhaseState.CANCELLED, f"{phase.executor} confirmed: {status.raw}")
        transition(session, run, RunState.CANCELLED,
                   f"cancelled by API; {phase.executor} job {phase.job_id} {status.raw}")
        return
    try:  # asked again on every pass until the executor confirms: a request can be lost
        if pool.is_warm(phase.job_name):  # the worker kills the attempt's children and goes back to idle
            pool.cancel_warm(settings, str(phase.job_name))
        else:
            launcher.cancel(job_of(phase, run))
    except Exception as exc:
        log.warning("run %s: cancelling %s job %s failed (%s); asking again", run.id, phase.executor,
                    phase.job_id, guard.describe(exc))


# PARITY_RUN_DISK_QUOTA for run attempts: how much an attempt folder may hold while its job runs.
#
# Each job file is capped by RLIMIT_FSIZE (service/executors/launcher.py); many small files are not,
# so the reconciler adds up the folder of every live attempt (at most every CHECK_INTERVAL_S each) and
# stops one that is past the quota.
CHECK_INTERVAL_S = 10.0
_last_check: dict[int, float] = {}


def exceeded(phase: Phase, folder: Path, settings: Settings, *, now: float | None = None) -> str | None:
    """Why the attempt is over its quota ("disk quota exceeded: ..."), or None (also between checks)."""
    now = time.monotonic() if now is None else now
    if now - _last_check.get(phase.id, float("-inf")) < CHECK_INTERVAL_S:
        return None
    _last_check[phase.id] = now
    if len(_last_check) > 10_000:  # phases long over: forget them
        _last_check.clear()
    limit = settings.run_disk_quota_bytes
    used = folder_bytes(folder, limit=limit)
    if used <= limit:
        return None
    return (f"disk quota exceeded: the attempt folder holds more than {used} bytes, past "
            f"PARITY_RUN_DISK_QUOTA={settings.run_disk_quota} ({limit} bytes)")


def file_at_limit(folder: Path, settings: Settings) -> str | None:
    """Why a job that ended with an error may have been stopped by the per-file limit: a file that
    reached PARITY_RUN_DISK_QUOTA (RLIMIT_FSIZE makes the next write fail with EFBIG, which the code
    under test reports in its own words, e.g. torch's "unexpected pos"). None when there is none."""
    limit = settings.run_disk_quota_bytes
    if not folder.is_dir():
        return None
    for dirpath, _dirs, files, dirfd in os.fwalk(folder, follow_symlinks=False):
        for name in files:
            try:
                size = os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
            if size >= limit:
                where = os.path.relpath(os.path.join(dirpath, name), folder)
                return (f"disk quota exceeded: {where} reached PARITY_RUN_DISK_QUOTA={settings.run_disk_quota} "
                        f"({limit} bytes), the most one file may hold")
    return None
