"""Run both phases of a parity check through submitit (local processes by default) and evaluate.

Isolation "process" (the default): one job whose tasks fork a fresh child per phase
(jobs/rank/attempt.py). Isolation "job": each phase is its own job in a fresh submitit folder.
Either way resumed ranks are new processes that never saw the training state. A phase that dies
without a result still yields a document: the rank files the phase writes itself, or an error
record with the tail of its log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from jobs.contract import ParityResult, PhaseDocument, PhaseName, error_record, phase_document
from jobs.documents import merge_rank_documents, read_rank_documents
from jobs.rank.attempt import run_attempt
from jobs.rank.context import write_json
from jobs.rank.dist import free_port
from jobs.rank.entry import run_rank_phase
from jobs.run_folder import RunFolder
from jobs.spec import RunSpec
from jobs.verdict.compare import evaluate

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


def _submit_and_wait(
    spec: RunSpec, folder: Path, executor: Any, timeout_s: float, function: Any, *args: Any, tasks: int | None = None
) -> tuple[Any, bool]:
    """Submit function(*args) with tasks_per_node = tasks (default the world size) and wait; (job, finished in time)."""
    ex = executor(folder) if callable(executor) else executor or local_executor(folder)
    ex.update_parameters(tasks_per_node=tasks or spec.world_size, nodes=1, timeout_min=max(1, int(timeout_s // 60)))
    t0 = time.perf_counter()
    job = ex.submit(function, *args)
    # submitit's own wait() polls once a second; a tighter poll keeps launch overhead honest.
    while not job.done():
        if time.perf_counter() - t0 > timeout_s:
            job.cancel()
            return job, False
        time.sleep(POLL_S)
    return job, True


def launch_phase(
    spec: RunSpec, run_folder: Path, phase: str, executor: Any = None, timeout_s: float = PHASE_TIMEOUT_S
) -> PhaseDocument:
    """Submit one phase, one task per rank (dp * tp * pp; resume_dp for a reshard); wait; rank 0's document."""
    folder = RunFolder(run_folder).attempt(phase, 1).submitit
    t0 = time.perf_counter()
    tasks = spec.phase_dp(phase) * spec.tp * spec.pp
    job, in_time = _submit_and_wait(
        spec, folder, executor, timeout_s, run_rank_phase, spec.to_dict(), str(run_folder), phase, free_port(),
        tasks=tasks,
    )
    if not in_time:
        return _failed_doc(spec, phase, f"phase {phase} timed out after {timeout_s:.0f} s")
    try:
        doc = merge_rank_documents(list(job.results()))
    except Exception as exc:  # noqa: BLE001 - a dead task: fall back to what the ranks wrote
        doc = merge_rank_documents(read_rank_documents(run_folder, phase, tasks))
        if doc is None:
            doc = _failed_doc(spec, phase, f"{type(exc).__name__}: {exc}", str(exc))
    assert doc is not None
    doc.setdefault("info", {})["launch_wall_seconds"] = round(time.perf_counter() - t0, 4)
    doc["info"]["submitit"] = {"folder": str(folder), "job_id": str(job.job_id)}
    return doc


def attempt_documents(
    spec: RunSpec, run_folder: Path, task_results: list[Any]
) -> tuple[PhaseDocument, PhaseDocument | None]:
    """(train_and_save, resume or None) merged over ranks from the tasks' attempt documents.

    A task that died without returning (a parent killed from outside) leaves its rank files; a
    phase no rank reached has no document.
    """
    merged: list[PhaseDocument | None] = []
    for phase in ("train_and_save", "resume"):
        docs: list[PhaseDocument] = [
            r["phases"][phase] for r in task_results if isinstance(r, dict) and phase in r.get("phases", {})
        ]
        if len(docs) < spec.world_size:
            docs = read_rank_documents(run_folder, phase, spec.world_size)
        merged.append(merge_rank_documents(docs))
    baseline, resumed = merged
    if baseline is None:
        baseline = _failed_doc(spec, "train_and_save", "no rank of the attempt returned a document")
    return baseline, resumed if baseline["status"] == "ok" else None


def run_attempt_job(
    spec: RunSpec, run_folder: Path, executor: Any = None, timeout_s: float = PHASE_TIMEOUT_S
) -> tuple[PhaseDocument, PhaseDocument | None]:
    """Isolation "process": one job runs both phases in forked children; (baseline, resumed)."""
    folder = RunFolder(run_folder).attempt("train_and_save", 1).submitit  # the job of the whole attempt
    t0 = time.perf_counter()
    job, in_time = _submit_and_wait(
        spec, folder, executor, 2 * timeout_s, run_attempt, spec.to_dict(), str(run_folder)
    )
    if not in_time:
        return _failed_doc(spec, "train_and_save", f"attempt timed out after {2 * timeout_s:.0f} s"), None
    results: list[Any] = []
    for task in range(spec.world_size):
        try:
            results.append(job.task(task).result())
        except Exception:  # noqa: BLE001 - a dead task: its rank files speak for it
            results.append(None)
    baseline, resumed = attempt_documents(spec, run_folder, results)
    wall = round(time.perf_counter() - t0, 4)
    for doc in (baseline, resumed):
        if doc is not None:
            doc["info"]["submitit"] = {"folder": str(folder), "job_id": str(job.job_id)}
            doc["info"]["attempt_wall_seconds"] = wall
    return baseline, resumed


def run_parity(
    spec: RunSpec, run_folder: Path, executor: Any = None, timeout_s: float = PHASE_TIMEOUT_S
) -> ParityResult:
    """Run train_and_save then resume (if a checkpoint was written) and evaluate them."""
    run_folder = Path(run_folder)
    run_folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    resumed: PhaseDocument | None = None
    if spec.effective_isolation == "process":  # a resharded resume always runs as its own job
        baseline, resumed = run_attempt_job(spec, run_folder, executor, timeout_s)
    else:
        baseline = launch_phase(spec, run_folder, "train_and_save", executor, timeout_s)
        if baseline.get("status") == "ok":
            resumed = launch_phase(spec, run_folder, "resume", executor, timeout_s)
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
    value = info.get("launch_wall_seconds", info.get("child_wall_seconds"))
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
    if result.get("advisories"):
        lines.append(f"advisories: {', '.join(result['advisories'])}")
    if result.get("worked_around"):
        by = result.get("worked_around_by") or {}
        lines += [f"passes only with workaround {w}, which hides {', '.join(sigs)}" for w, sigs in sorted(by.items())]
    lines.append(f"first divergent step: {_fmt(result.get('first_divergent_step'), '')}")
    for err in result.get("errors") or []:
        lines.append(f"error in {err.get('stage')}: {err.get('type')}: {str(err.get('message'))[:300]}")
    return "\n".join(lines)
