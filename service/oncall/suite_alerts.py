"""A failed suite run as one regression group: one alert naming the pull request and listing its failing checks.

A broken PR fails several checks of the gate at once. Each check still opens (or joins) its own
regression, as before, but the per-check `regression.opened` messages of a suite run's checks are
not sent: when the suite run's last check is judged and the suite fails with a regression among its
checks, one `suite-run.failed` message goes out instead (deduplicated by the suite run's id), naming
the branch, commit and pipeline and linking every failing check's triage page and regression.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.verdict_names import FAIL
from models import Regression, Run, Suite, SuiteRun
from service.core.links import public_base, regression_url, run_url
from service.core.settings import get_settings
from service.core.state_names import FINISHED_RUN_STATES
from service.core.verdicts import reading
from service.oncall.notification_events import enqueue

EVENT = "suite-run.failed"
TERMINAL = FINISHED_RUN_STATES
PR_LABELS = ("branch", "commit", "pr", "pipeline_url", "base_branch")


def suite_run_of(run: Run) -> str | None:
    """The suite run a run belongs to (its `suite_run` label), if any."""
    return (run.labels or {}).get("suite_run")


def _failing(run: Run) -> bool:
    return bool(run.regression) or run.verdict == FAIL


def group_of(session: Session, suite_run: SuiteRun, runs: dict[int, Run] | None = None) -> list[dict[str, Any]]:
    """The suite run's failing checks: name, run, and the regression each opened or joined (runs: its runs by
    id, when the caller has them loaded)."""
    ids = [item["run_id"] for item in suite_run.runs]
    if runs is None:
        runs = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(ids)))}
    keys = [(r.check_key, r.track) for r in runs.values() if _failing(r)]
    regs: dict[tuple[str, str], Regression] = {}
    if keys:
        for found in session.scalars(select(Regression).where(Regression.check_key.in_([k for k, _ in keys]))
                                     .order_by(Regression.id)):
            if (found.check_key, found.track) in keys and any(rid in found.failing_run_ids for rid in ids):
                regs[(found.check_key, found.track)] = found
    failing = []
    for item in suite_run.runs:
        run = runs.get(item["run_id"])
        if run is None or not _failing(run):
            continue
        reg = regs.get((run.check_key, run.track))
        failing.append({"check": item["name"], "run": run, "regression": reg})
    return failing


def on_check_ended(session: Session, run: Run) -> bool:
    """After a suite check ended (a verdict, or an infrastructure error): if it was the suite run's last and the
    suite failed with a regression among its checks, enqueue the one alert. -> whether it was enqueued (a repeat
    adds nothing)."""
    suite_run_id = suite_run_of(run)
    if not suite_run_id:
        return False
    # checks judged at once in two transactions: the second waits here and then sees the first's verdict
    suite_run = session.scalar(select(SuiteRun).where(SuiteRun.id == suite_run_id).with_for_update())
    if suite_run is None:
        return False
    session.flush()
    ids = [item["run_id"] for item in suite_run.runs]
    rows = session.execute(select(Run.id, Run.state, Run.verdict).where(Run.id.in_(ids))).all()
    if len(rows) != len(ids) or any(r.state not in TERMINAL and r.verdict is None for r in rows):
        return False  # a check is still running (the run being judged has its verdict, not yet its state)
    failing = group_of(session, suite_run)
    if not any(f["run"].regression for f in failing):
        return False
    suite = session.get(Suite, suite_run.suite_id)
    enqueue(session, EVENT, f"suite-run-{suite_run.id}-failed",
            payload(suite_run, suite.name if suite else "?", failing, total=len(ids)))
    return True


def payload(suite_run: SuiteRun, suite: str, failing: list[dict[str, Any]], *, total: int) -> dict[str, Any]:
    """The message: the PR (branch, commit, pipeline), the suite run's link, one entry per failing check."""
    base = public_base(get_settings())
    labels = suite_run.labels or {}
    pr = {k: labels[k] for k in PR_LABELS if labels.get(k)}
    checks = []
    for f in failing:
        run, reg = f["run"], f["regression"]
        read = reading(run)
        checks.append({
            "check": f["check"], "run_id": run.id, "check_key": run.check_key, "verdict": read.label,
            "reading": read.to_dict(), "triage_url": run_url(base, run.id, "triage"),
            "regression_id": reg.id if reg else None, "regression_url": regression_url(base, reg.id) if reg else None,
        })
    where = pr.get("branch") or suite_run.environment
    ident = ", ".join(f"{k} {pr[k]}" for k in ("commit", "pr") if k in pr)
    summary = (f"Suite {suite} failed on {where}" + (f" ({ident})" if ident else "")
               + f": {len(checks)} of {total} checks fail — " + "; ".join(f"{c['check']}: {c['verdict']}"
                                                                           for c in checks))
    first = checks[0] if checks else {}
    return {
        "event": EVENT,
        "title": f"Suite {suite} failed on {where}",
        "summary": summary,
        "pr": pr,
        "pipeline_url": pr.get("pipeline_url"),
        "suite_run": {"id": suite_run.id, "suite": suite, "environment": suite_run.environment,
                      "url": f"{base}/suite-runs/{suite_run.id}"},
        "failing": checks,
        "run_id": first.get("run_id"),
        "triage_url": first.get("triage_url"),
        "run_url": f"{base}/suite-runs/{suite_run.id}",
    }
