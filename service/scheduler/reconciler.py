"""Reconciler: poll every in-flight phase in one batch and move runs along the state machine.

Infra failures (cancelled, node failure, preemption, time limit, a vanished local job) are retried
with backoff up to PARITY_MAX_INFRA_RETRIES and never reported as parity results; a phase that ran
and returned a document (even one describing a crash) is a parity answer and is never retried.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.contract import ErrorRecord, PhaseName, error_record, phase_document
from models import Phase, Run
from models.base import utcnow
from service.documents import InvalidDocument, rejected_document, validate_phase_document
from service.scheduler import launcher
from service.scheduler.submitter import PHASES, SUBMITTED_STATE, new_phase, retry_or_give_up
from service.settings import Settings
from service.state import RunState, transition

log = logging.getLogger(__name__)
RUNNING_STATE: dict[str, RunState] = {"train_and_save": RunState.TRAIN_RUNNING, "resume": RunState.RESUME_RUNNING}


def _phase_job(phase: Phase, run: Run) -> launcher.PhaseJob:
    return launcher.PhaseJob(
        executor=phase.executor, folder=phase.folder or "", job_id=phase.job_id or "", tasks=int(run.spec["dp"])
    )


def reconcile(session: Session, *, settings: Settings) -> int:
    """One pass over all submitted/running phases (row-locked, skipping ones another replica holds)."""
    rows = session.execute(
        select(Phase, Run).join(Run, Run.id == Phase.run_id)
        .where(Phase.state.in_(("submitted", "running")))
        .order_by(Phase.id).with_for_update(of=Phase, skip_locked=True)
    ).tuples().all()
    if not rows:
        return 0
    statuses = launcher.poll([_phase_job(phase, run) for phase, run in rows])
    for phase, run in rows:
        job = _phase_job(phase, run)
        status = statuses[job]
        if run.cancel_requested:
            _cancel(session, phase, run, job)
        elif status.kind == "running" and phase.state == "submitted":
            phase.state, phase.started_at = "running", utcnow()
            if run.state == SUBMITTED_STATE[phase.name]:
                transition(session, run, RUNNING_STATE[phase.name], f"{phase.executor} job {phase.job_id} running")
        elif status.kind in ("done", "failed"):
            # a FAILED job (a rank died) may still have rank 0's document: keep its evidence if so
            _finished(session, phase, run, job, settings)
        elif status.kind == "infra":
            _infra_failure(session, phase, run, status.raw, settings)
    return len(rows)


def _close(phase: Phase, state: str, job: launcher.PhaseJob, reason: str | None = None) -> None:
    phase.state, phase.ended_at, phase.exit_reason = state, utcnow(), reason
    if phase.started_at is None:
        phase.started_at = phase.submitted_at
    if phase.started_at:
        phase.duration_s = (phase.ended_at - phase.started_at).total_seconds()
    phase.log_paths = collect_log_paths(phase, job)


def collect_log_paths(phase: Phase, job: launcher.PhaseJob) -> list[str]:
    """The job's own per-rank logs (where a caught traceback lands) first, then submitit's stdout/stderr."""
    rank_dir = Path(phase.folder or ".").parent / phase.name
    own = [rank_dir / f"rank{rank}.log" for rank in range(job.tasks)]
    return [str(p) for p in own if p.is_file()] + launcher.log_paths(job)


def _finished(session: Session, phase: Phase, run: Run, job: launcher.PhaseJob, settings: Settings) -> None:
    raw, error = launcher.fetch_result(job)
    if raw is None:
        _job_raised(session, phase, run, job, error)
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
    _close(phase, "succeeded" if ok else "failed", job, None if ok else _doc_error(doc["error"]))
    if ok and phase.name == PHASES[0]:
        new_phase(session, run=run, name=PHASES[1], attempt=1, settings=settings)
        transition(session, run, RunState.RESUME_SUBMITTED, f"{phase.name} finished; resume queued")
    else:
        # both phases done, or a phase crashed inside the job: either way the evaluator decides
        transition(session, run, RunState.EVALUATING, f"{phase.name} returned {doc['status']}")


def _doc_error(err: ErrorRecord | None) -> str:
    if err is None:
        return "error: no error record"
    return f"{err['stage']}: {err['type']}: {err['message']}"[:2000]


def _job_raised(session: Session, phase: Phase, run: Run, job: launcher.PhaseJob, error: str | None) -> None:
    """The job ended without rank 0's document (it raised, or the rank died): an error, not retried."""
    _close(phase, "failed", job, error or "job failed without a result")
    record = error_record("JobFailed", error or "", stage="job")
    phase.info = cast(
        dict[str, Any], phase_document(run.spec, cast(PhaseName, phase.name), 0, status="error", error=record)
    )
    run.error_message = f"{phase.name} job {phase.job_id} failed: {(error or '')[-1500:]}"
    transition(session, run, RunState.EVALUATING, f"{phase.name} job raised")


def _infra_failure(session: Session, phase: Phase, run: Run, raw: str, settings: Settings) -> None:
    job = _phase_job(phase, run)
    _close(phase, "infra_failed", job, f"{phase.executor} state {raw}")
    retry_or_give_up(session, phase=phase, run=run, what=f"job {phase.job_id} ended {raw}", settings=settings)


def _cancel(session: Session, phase: Phase, run: Run, job: launcher.PhaseJob) -> None:
    launcher.cancel(job)
    _close(phase, "cancelled", job, "cancelled by API")
    transition(session, run, RunState.CANCELLED, f"cancelled by API; {phase.executor} job {phase.job_id} cancelled")
