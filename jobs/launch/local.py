"""run-local: execute a run's plan (jobs/protocol.py) in place through submitit, and evaluate.

The plan decides everything the scheduler also decides from it: the phases, the tasks of each, the
isolation (under "process" one job forks a fresh child per phase; under "job" each phase is its own
job) and each job's payload; the phase documents are read from the ranks' files exactly as the
scheduler reads them. So a reproduction runs what the service ran. A phase that dies without a
document still yields one: an error record saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from jobs.contract import ParityResult, PhaseDocument, PhaseName, error_record, phase_document
from jobs.protocol import PHASES, Payload, RunPlan
from jobs.rank.context import write_json
from jobs.run_folder import RunFolder
from jobs.spec import RunSpec
from jobs.verdict.compare import evaluate
from jobs.verdict_names import PASS

ExecutorFactory = Callable[[Path], Any]
PHASE_TIMEOUT_S = 900.0
POLL_S = 0.05


def local_executor(folder: Path) -> Any:
    """Return a submitit executor running tasks as local processes in `folder`."""
    import submitit

    return submitit.AutoExecutor(folder=str(folder), cluster="local")


def _failed_doc(spec: RunSpec, phase: str, message: str, tb: str = "") -> PhaseDocument:
    error = error_record("PhaseFailed", message, stage="launch", rank=0, traceback=tb)
    return phase_document(spec.to_dict(), cast(PhaseName, phase), 0, status="error", error=error)


def _run_job(plan: RunPlan, payload: Payload, folder: Path, executor: Any, timeout_s: float) -> tuple[Any, bool]:
    """Submit one job of the plan (its tasks on this host) and wait; (job, finished in time)."""
    ex = executor(folder) if callable(executor) else executor or local_executor(folder)
    ex.update_parameters(tasks_per_node=payload.tasks, nodes=1, timeout_min=max(1, int(timeout_s // 60)))
    if payload.gpus_per_node:  # a cuda check: one GPU per rank (submitit's local executor sets CUDA_VISIBLE_DEVICES)
        ex.update_parameters(gpus_per_node=payload.gpus_per_node)
    t0 = time.perf_counter()
    job = ex.submit(payload.function(), *payload.args)
    # submitit's own wait() polls once a second; a tighter poll keeps launch overhead honest.
    while not job.done():
        if time.perf_counter() - t0 > timeout_s:
            job.cancel()
            return job, False
        time.sleep(POLL_S)
    return job, True


def _collected(plan: RunPlan, run_folder: Path, phase: PhaseName, job: Any) -> PhaseDocument | None:
    """The phase's document from its ranks' files, as the scheduler reads it (jobs/protocol.py)."""
    doc, refused = plan.collect(plan.attempt_folder(run_folder, phase, 1), phase)
    if doc is None and refused:
        return _failed_doc(plan.spec, phase, "; ".join(refused))
    return doc


def run_job(
    plan: RunPlan, run_folder: Path, phase: PhaseName, executor: Any = None, timeout_s: float = PHASE_TIMEOUT_S
) -> dict[PhaseName, PhaseDocument | None]:
    """Run the job of attempt 1 of `phase` (under "process" it forks the resume too); each phase's document."""
    payload = plan.payload(run_folder, phase)
    folder = RunFolder(run_folder).attempt(phase, 1).submitit  # the job's own folder
    limit = timeout_s * len(payload.phases)
    t0 = time.perf_counter()
    job, in_time = _run_job(plan, payload, folder, executor, limit)
    wall = round(time.perf_counter() - t0, 4)
    docs: dict[PhaseName, PhaseDocument | None] = {p: _collected(plan, run_folder, p, job) for p in payload.phases}
    if docs[phase] is None:
        why = f"{phase} timed out after {limit:.0f} s" if not in_time else "no rank of the job wrote a document"
        docs[phase] = _failed_doc(plan.spec, phase, why)
    for doc in docs.values():
        if doc is not None:
            doc.setdefault("info", {})["launch_wall_seconds"] = wall
            doc["info"]["submitit"] = {"folder": str(folder), "job_id": str(job.job_id)}
    return docs


def launch_phase(
    spec: RunSpec, run_folder: Path, phase: PhaseName, executor: Any = None, timeout_s: float = PHASE_TIMEOUT_S
) -> PhaseDocument:
    """One phase as its own job (isolation "job"): the benchmarks' plain launch of `uninterrupted`."""
    plan = RunPlan.of(replace(spec, isolation="job"))
    doc = run_job(plan, Path(run_folder), phase, executor, timeout_s)[phase]
    assert doc is not None
    return doc


def run_parity(
    spec: RunSpec, run_folder: Path, executor: Any = None, timeout_s: float = PHASE_TIMEOUT_S
) -> ParityResult:
    """Run the run's plan in place: train_and_save, then resume if a checkpoint was written; evaluate."""
    run_folder = Path(run_folder)
    run_folder.mkdir(parents=True, exist_ok=True)
    plan = RunPlan.of(spec)
    t0 = time.perf_counter()
    docs = run_job(plan, run_folder, PHASES[0], executor, timeout_s)
    baseline = docs[PHASES[0]]
    assert baseline is not None
    resumed = docs.get(PHASES[1])
    if baseline.get("status") != "ok":
        resumed = None
    elif not plan.forks_resume(PHASES[0]):
        resumed = run_job(plan, run_folder, PHASES[1], executor, timeout_s)[PHASES[1]]
    result = evaluate(spec.to_dict(), baseline, resumed)
    result["run_folder"] = str(run_folder)
    result["timing"] = {
        "total_seconds": round(time.perf_counter() - t0, 4),
        "train_and_save_seconds": _phase_seconds(baseline),
        "resume_seconds": None if resumed is None else _phase_seconds(resumed),
    }
    write_json(run_folder / "result.json", result)
    return result


def _phase_seconds(doc: PhaseDocument) -> float | None:
    info = doc.get("info", {})
    value = info.get("child_wall_seconds", info.get("launch_wall_seconds"))
    return None if value is None else float(value)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_step_table(result: ParityResult) -> str:
    """Render the per-step comparison and the verdict as a plain-text table."""
    lines = [
        f"{'step':>5} {'loss baseline':>14} {'loss resumed':>14} {'d loss':>10} "
        f"{'lr baseline':>12} {'lr resumed':>12} {'d lr':>10}  match"
    ]
    for r in result.get("steps", []):
        if not r.get("resumed_phase"):
            continue
        mark = "" if "exact" not in r else ("exact" if r["exact"] else ("tol" if r["within_tolerance"] else "DIFF"))
        lines.append(
            f"{r['step']:>5} {_fmt(r['loss_baseline'], '14.8f')} {_fmt(r['loss_resumed'], '14.8f')} "
            f"{_fmt(r['loss_abs_delta'], '+10.2e')} {_fmt(r['lr_baseline'], '12.6e')} "
            f"{_fmt(r['lr_resumed'], '12.6e')} {_fmt(r['lr_abs_delta'], '+10.2e')}  {mark}"
        )
    lines.append("")
    verdict = result.get("verdict_label") or result.get("verdict")
    lines.append(f"verdict: {verdict}  (isolation: {result.get('isolation', '-')})")
    lines.append(f"signatures: {', '.join(result.get('signatures') or []) or '-'}")
    lines += [f"cause: {line}" for line in (result.get("cause_lines") or {}).values()]  # what the resume lost
    if result.get("advisories"):
        lines.append(f"advisories: {', '.join(result['advisories'])}")
    if result.get("worked_around"):
        by = result.get("worked_around_by") or {}
        hides = "passes only with" if result.get("verdict") == PASS else "requested"
        lines += [f"{hides} workaround {w}, which hides {', '.join(sigs)}" for w, sigs in sorted(by.items())]
    for w in result.get("workarounds_not_needed") or []:
        lines.append(f"workaround {w} was not needed: the bug it corrects did not fire on this build")
    lines.append(f"first divergent step: {_fmt(result.get('first_divergent_step'), '')}")
    for err in result.get("errors") or []:
        lines.append(f"error in {err.get('stage')}: {err.get('type')}: {str(err.get('message'))[:300]}")
    return "\n".join(lines)
