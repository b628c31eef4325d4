"""Evaluator: turn two phase documents into a verdict, stored deltas, probe findings and a regression flag.

The run's own slice holds it (runs/ owns a run's lifecycle: submit, reconcile, evaluate); the scheduler evaluates
pending runs in batches, each in a savepoint of its own (service/scheduler/evaluation.py).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from jobs.contract import ErrorRecord, ParityResult, PhaseDocument, Verdict, exception_record, parity_result
from jobs.verdict.compare import evaluate
from jobs.verdict_names import ERROR, FAIL, PASS
from models import Environment, Phase, ProbeFinding, Run, StepMetric
from models.jsonsafe import decode_nonfinite
from service.core.phase_state import PhaseState
from service.core.run_state import RunState
from service.oncall import flagging as regressions
from service.oncall import known_failures
from service.oncall import regressions as regression_tracker
from service.oncall.flagging import fails_on_base_text
from service.runs.lifecycle import transition
from service.runs.phase_documents import validate_result

log = logging.getLogger(__name__)
METRIC_COLUMNS = frozenset(c.name for c in StepMetric.__table__.columns) - {"run_id"}
VERDICT_STATE: dict[Verdict, RunState] = {PASS: RunState.PASSED, FAIL: RunState.FAILED, ERROR: RunState.ERROR}


def latest_documents(session: Session, run_id: int) -> dict[str, PhaseDocument]:
    """The result document of the last finished attempt of each phase (validated when ingested;
    non-finite numbers, stored as strings, restored)."""
    finished = (PhaseState.SUCCEEDED.value, PhaseState.FAILED.value)
    phases = session.scalars(
        select(Phase).where(Phase.run_id == run_id, Phase.state.in_(finished)).order_by(Phase.id)
    )
    return {phase.name: cast(PhaseDocument, decode_nonfinite(phase.info)) for phase in phases}


def evaluate_run(session: Session, run: Run) -> None:
    """Compare a run's phase documents, store the verdict and move the run to passed/failed/error."""
    docs = latest_documents(session, run.id)
    try:
        result = validate_result(evaluate(run.spec, docs.get("train_and_save"), docs.get("resume")))
    except Exception as exc:  # a bug in comparison (or an invalid result) must not wedge the queue
        log.exception("evaluation of run %s failed", run.id)
        result = parity_result(ERROR, run.spec, errors=[exception_record(exc, "evaluate")])
    # packages first: the known-failure rules match on the build this run used
    record_packages(session, run, docs)
    store_result(session, run, result)
    transition(session, run, VERDICT_STATE[result["verdict"]], f"verdict {result['verdict']}")


PACKAGE_KEYS = ("torch", "megatron_core", "python", "device", "backend")


def end_as_the_builds_answer(session: Session, run: Run, signature: str, error: ErrorRecord, line: str) -> None:
    """End a run the build under test answered before any phase could (its environment's import check failed on
    megatron.core): `fail`, naming the build's error, through the same flags, regression and final-state handlers
    as an evaluated verdict; never `error`, which is the service's own "couldn't tell"."""
    result = parity_result(FAIL, run.spec, errors=[error], signatures=[signature], cause_lines={signature: line})
    store_result(session, run, result)
    transition(session, run, RunState.FAILED, f"the build's answer before any phase: {signature}")


def record_packages(session: Session, run: Run, docs: dict[str, PhaseDocument]) -> None:
    """Keep the environment's package versions as the jobs last reported them (triage diffs these)."""
    info = next((d.get("info") or {} for d in docs.values() if (d.get("info") or {}).get("torch")), {})
    if not info:
        return
    packages = {key: info[key] for key in PACKAGE_KEYS if key in info}
    run.summary = {**run.summary, "packages": packages}
    env = session.get(Environment, run.environment_id)
    # merged: what the build and its import check recorded (capabilities, import_check, python_version) stays
    merged = {**(env.packages or {}), **packages} if env is not None else packages
    if env is not None and env.packages != merged:
        env.packages = merged


def store_result(session: Session, run: Run, result: ParityResult) -> None:
    """Write verdict, signatures, per-step deltas and probe findings; then flag regressions."""
    session.execute(delete(StepMetric).where(StepMetric.run_id == run.id))
    session.execute(delete(ProbeFinding).where(ProbeFinding.run_id == run.id))
    steps = result["steps"]
    if steps:
        session.execute(
            insert(StepMetric),
            [{"run_id": run.id, **{k: v for k, v in s.items() if k in METRIC_COLUMNS}} for s in steps],
        )
    findings = list(probe_findings(result))
    if findings:
        session.execute(insert(ProbeFinding), [{"run_id": run.id, **f} for f in findings])
    run.verdict = result["verdict"]
    run.signatures = list(result["signatures"])
    run.first_divergent_step = result["first_divergent_step"]
    run.first_step_beyond_tolerance = result["first_step_beyond_tolerance"]
    deltas = [abs(d) for s in steps if (d := s["loss_abs_delta"]) is not None]
    run.max_abs_loss_delta = max(deltas) if deltas else None
    kept = {k: run.summary[k] for k in ("packages",) if k in (run.summary or {})}
    run.summary = {**kept, **{k: v for k, v in result.items() if k not in ("steps", "probes")}}
    rel = [abs(d) for s in steps if s["resumed_phase"] and (d := s["loss_rel_delta"]) is not None]
    if rel:  # what a tolerance-judged verdict is read against its bound by (service/core/verdicts.reading)
        run.summary["measured"] = {"loss_rel": max(rel)}
    err = result["error"]
    if err and not run.error_message:
        run.error_message = f"{err['type']}: {err['message']}"[:4000]
    judge(session, run)


def judge(session: Session, run: Run) -> None:
    """After the verdict: known upstream bugs, the history flags, then the regression object (and its outbox); the
    suite run's alert follows at the commit (service/runs/lifecycle.py)."""
    # may turn fail/error into known-failure (a service verdict: the run's state stays failed/error)
    known_failures.apply(session, run)
    regressions.flag(session, run)
    # a failure the base track's latest run shares is not the branch's (outcome `fails-on-base`): decided once,
    # here, with the verdict, and read by every answer to CI (service/core/outcome.py)
    shared = fails_on_base_text(session, run) if run.verdict == FAIL and not run.regression else ""
    if shared:
        run.summary = {**(run.summary or {}), "fails_on_base": shared}
    regression_tracker.on_verdict(session, run)


def probe_findings(result: ParityResult) -> list[dict[str, Any]]:
    """The result's flattened probe rows, as probe_findings table rows."""
    return [dict(item) for item in result["probe_findings"]]
