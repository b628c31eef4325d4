"""Evaluator: turn two phase documents into a verdict, stored deltas, probe findings and a regression flag."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from jobs.verdict.compare import evaluate
from models import Environment, Phase, ProbeFinding, Run, StepMetric
from service import known_failures, regression_tracker, regressions
from service.state import RunState, transition

log = logging.getLogger(__name__)
METRIC_COLUMNS = frozenset(c.name for c in StepMetric.__table__.columns) - {"run_id"}
# known-failure: the run failed, but only in ways recorded as known upstream bugs (service/known_failures.py)
VERDICT_STATE = {"pass": RunState.PASSED, "fail": RunState.FAILED, "error": RunState.ERROR,
                 "known-failure": RunState.FAILED}


def latest_documents(session: Session, run_id: int) -> dict[str, dict[str, Any]]:
    """The result document of the last finished attempt of each phase."""
    phases = session.scalars(
        select(Phase).where(Phase.run_id == run_id, Phase.state.in_(("succeeded", "failed"))).order_by(Phase.id)
    )
    return {phase.name: phase.info for phase in phases}


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
        result = evaluate(run.spec, docs.get("train_and_save"), docs.get("resume"))
    except Exception as exc:  # a bug in comparison must not wedge the queue
        log.exception("evaluation of run %s failed", run.id)
        result = {"verdict": "error", "signatures": [], "steps": [], "probes": [],
                  "error": {"type": type(exc).__name__, "message": str(exc)}}
    # packages first: the known-failure rules match on the build this run used
    record_packages(session, run, docs)
    store_result(session, run, result)
    transition(session, run, VERDICT_STATE[result["verdict"]], f"verdict {result['verdict']}")
    return True


PACKAGE_KEYS = ("torch", "megatron_core", "python", "device", "backend")


def record_packages(session: Session, run: Run, docs: dict[str, dict[str, Any]]) -> None:
    """Keep the environment's package versions as the jobs last reported them (triage diffs these)."""
    info = next((d.get("info") or {} for d in docs.values() if (d.get("info") or {}).get("torch")), {})
    if not info:
        return
    packages = {key: info[key] for key in PACKAGE_KEYS if key in info}
    run.summary = {**run.summary, "packages": packages}
    env = session.get(Environment, run.environment_id)
    if env is not None and env.packages != packages:
        env.packages = packages


def store_result(session: Session, run: Run, result: dict[str, Any]) -> None:
    """Write verdict, signatures, per-step deltas and probe findings; then flag regressions."""
    session.execute(delete(StepMetric).where(StepMetric.run_id == run.id))
    session.execute(delete(ProbeFinding).where(ProbeFinding.run_id == run.id))
    steps = result.get("steps") or []
    if steps:
        session.execute(
            insert(StepMetric),
            [{"run_id": run.id, **{k: v for k, v in s.items() if k in METRIC_COLUMNS}} for s in steps],
        )
    findings = list(probe_findings(result))
    if findings:
        session.execute(insert(ProbeFinding), [{"run_id": run.id, **f} for f in findings])
    run.verdict = result["verdict"]
    run.signatures = list(result.get("signatures") or [])
    run.first_divergent_step = result.get("first_divergent_step")
    run.first_step_beyond_tolerance = result.get("first_step_beyond_tolerance")
    deltas = [abs(s["loss_abs_delta"]) for s in steps if s.get("loss_abs_delta") is not None]
    run.max_abs_loss_delta = max(deltas) if deltas else None
    kept = {k: run.summary[k] for k in ("packages",) if k in (run.summary or {})}
    run.summary = {**kept, **{k: v for k, v in result.items() if k not in ("steps", "probes")}}
    if result.get("error") and not run.error_message:
        err = result["error"]
        run.error_message = f"{err.get('type', 'Error')}: {err.get('message', '')}"[:4000]
    judge(session, run)


def judge(session: Session, run: Run) -> None:
    """After the verdict: known upstream bugs, the history flags, then the regression object (and its outbox)."""
    known_failures.apply(session, run)
    regressions.flag(session, run)
    regression_tracker.on_verdict(session, run)


def probe_findings(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Flatten the result's probe section into rows (one per probe, plus one per implicated param)."""
    rows = []
    for item in result.get("probe_findings") or []:
        rows.append({
            "phase": str(item.get("phase", "")), "probe": str(item.get("probe", "")), "ok": bool(item.get("ok")),
            "param_name": item.get("param_name"), "detail": item.get("detail") or {},
        })
    return rows
