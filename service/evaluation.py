"""Evaluator: turn two phase documents into a verdict, stored deltas, probe findings and a regression flag."""

from __future__ import annotations

import logging
from typing import Any, cast

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from jobs.contract import ParityResult, PhaseDocument, Verdict, exception_record, parity_result
from jobs.verdict.compare import evaluate
from models import Environment, Phase, ProbeFinding, Run, StepMetric
from service import regressions
from service.documents import validate_result
from service.state import RunState, transition

log = logging.getLogger(__name__)
METRIC_COLUMNS = frozenset(c.name for c in StepMetric.__table__.columns) - {"run_id"}
VERDICT_STATE: dict[Verdict, RunState] = {"pass": RunState.PASSED, "fail": RunState.FAILED, "error": RunState.ERROR}


def latest_documents(session: Session, run_id: int) -> dict[str, PhaseDocument]:
    """The result document of the last finished attempt of each phase (validated when ingested)."""
    phases = session.scalars(
        select(Phase).where(Phase.run_id == run_id, Phase.state.in_(("succeeded", "failed"))).order_by(Phase.id)
    )
    return {phase.name: cast(PhaseDocument, phase.info) for phase in phases}


def evaluate_one(session: Session) -> bool:
    """Evaluate one run in state evaluating (row-locked). False when there is none."""
    run = session.scalar(
        select(Run).where(Run.state == RunState.EVALUATING.value).order_by(Run.id).limit(1)
        .with_for_update(skip_locked=True)
    )
    if run is None:
        return False
    docs = latest_documents(session, run.id)
    try:
        result = validate_result(evaluate(run.spec, docs.get("train_and_save"), docs.get("resume")))
    except Exception as exc:  # a bug in comparison (or an invalid result) must not wedge the queue
        log.exception("evaluation of run %s failed", run.id)
        result = parity_result("error", run.spec, errors=[exception_record(exc, "evaluate")])
    store_result(session, run, result)
    record_packages(session, run, docs)
    transition(session, run, VERDICT_STATE[result["verdict"]], f"verdict {result['verdict']}")
    return True


PACKAGE_KEYS = ("torch", "megatron_core", "python", "device", "backend")


def record_packages(session: Session, run: Run, docs: dict[str, PhaseDocument]) -> None:
    """Keep the environment's package versions as the jobs last reported them (triage diffs these)."""
    info = next((d.get("info") or {} for d in docs.values() if (d.get("info") or {}).get("torch")), {})
    if not info:
        return
    packages = {key: info[key] for key in PACKAGE_KEYS if key in info}
    run.summary = {**run.summary, "packages": packages}
    env = session.get(Environment, run.environment_id)
    if env is not None and env.packages != packages:
        env.packages = packages


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
    run.summary = {k: v for k, v in result.items() if k not in ("steps", "probes")}
    err = result["error"]
    if err and not run.error_message:
        run.error_message = f"{err['type']}: {err['message']}"[:4000]
    regressions.flag(session, run)


def probe_findings(result: ParityResult) -> list[dict[str, Any]]:
    """The result's flattened probe rows, as probe_findings table rows."""
    return [dict(item) for item in result["probe_findings"]]
