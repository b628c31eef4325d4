"""Suite runs: every check of a suite version queued on one environment, and the one verdict they add up to.

Each check is an ordinary run (labels `suite=<name>`, `suite_run=<id>`, `suite_check=<check>`), so its
history, regressions and triage page are the check's own; the suite run only records which runs it is.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from models import Run, Suite, SuiteRun
from service.core.check_spec import run_spec_of
from service.core.checks import track_regex
from service.core.errors import Conflict, InvalidSpec, NotFound
from service.core.links import regression_url
from service.core.outcome import FAILS_ON_BASE, OUTCOMES, check_result, of_suite
from service.core.schemas import SUITE_LABELS
from service.core.settings import Settings
from service.core.state_names import FINISHED_RUN_STATES
from service.environments.registry import (
    DEFAULT_ENVIRONMENT,
    ensure_default_environment,
    get_environment,
    use_environment,
)
from service.oncall.suite_alerts import group_of
from service.runs.api import run_out
from service.runs.records import Caps, create_run
from service.suites.definitions import get_suite

TERMINAL = FINISHED_RUN_STATES


def create_suite_run(
    session: Session, *, suite_name: str, version: int | None, environment: str, labels: dict[str, str],
    requester: str | None, settings: Settings, caps: Caps | None = None, token_id: int | None = None,
    idempotency_key: str | None = None,
) -> tuple[SuiteRun, bool]:
    """Queue one run per check of the suite on the environment. -> (suite run, created)."""
    suite = get_suite(session, name=suite_name, version=version)
    env = (ensure_default_environment(session, settings=settings) if environment == DEFAULT_ENVIRONMENT
           else get_environment(session, name=environment))
    base = {k: v for k, v in labels.items() if k not in SUITE_LABELS}
    if idempotency_key is not None:
        # one request per (token, key) at a time: a concurrent retry waits here, then finds the first one's row
        session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"suite-run:{token_id}:{idempotency_key}"))))
        existing = session.scalar(select(SuiteRun).where(SuiteRun.token_id == token_id,
                                                         SuiteRun.idempotency_key == idempotency_key))
        if existing is not None:
            differs = [name for name, same in (("suite", existing.suite_id == suite.id),
                                               ("environment", existing.environment == env.name),
                                               ("labels", existing.labels == base)) if not same]
            if differs:
                raise Conflict(f"Idempotency-Key: already used by this token for a suite run with a different "
                               f"{', '.join(differs)} ({existing.id})", field="Idempotency-Key")
            return existing, False
    use_environment(env)
    suite_run_id = uuid.uuid4().hex[:12]
    runs = []
    for i, check in enumerate(suite.checks):
        try:
            run, _ = create_run(
                session, spec=run_spec_of(check["spec"]), environment=env, requester=requester, token_id=token_id,
                labels={**base, "suite": suite.name, "suite_run": suite_run_id, "suite_check": check["name"]},
                caps=caps,
            )
        except InvalidSpec as exc:  # a cuda check this executor cannot give its GPUs: named, nothing queued
            raise InvalidSpec(f"suite {suite.name!r} checks[{i}] ({check['name']}): {exc.detail}",
                              field=f"checks[{i}].{exc.field or 'spec'}") from None
        runs.append({"name": check["name"], "run_id": run.id})
    suite_run = SuiteRun(id=suite_run_id, suite_id=suite.id, environment=env.name, labels=base,
                         requester=requester, runs=runs, token_id=token_id, idempotency_key=idempotency_key)
    session.add(suite_run)
    session.flush()
    return suite_run, True


def cause(run: dict[str, Any]) -> str:
    """Why a check did not pass, as its reading says it: sentences with their slugs, else the error's first line."""
    return str((run.get("reading") or {}).get("cause") or "")


def suite_run_view(session: Session, *, suite_run_id: str, base: str) -> dict[str, Any]:
    """The suite run: one row per check (its run's verdict, signatures, triage link) and the overall verdict."""
    suite_run = session.get(SuiteRun, suite_run_id)
    if suite_run is None:
        raise NotFound(f"suite_run: unknown suite run {suite_run_id!r}", field="suite_run")
    suite = session.get(Suite, suite_run.suite_id)
    assert suite is not None
    ids = [r["run_id"] for r in suite_run.runs]
    by_id = {r.id: r for r in session.scalars(
        select(Run).where(Run.id.in_(ids)).options(selectinload(Run.environment)))}
    regressions = {f["check"]: f["regression"] for f in group_of(session, suite_run, by_id)
                   if f["regression"] is not None}
    checks = []
    for item in suite_run.runs:
        row = by_id[item["run_id"]]
        run = run_out(row, base).model_dump(mode="json")
        result = run["outcome"]["result"]  # computed once, with the run's own (service/core/outcome.py)
        shared = (row.summary or {}).get("fails_on_base") if result == FAILS_ON_BASE else None
        reg = regressions.get(item["name"])
        checks.append({"name": item["name"], "outcome": result, "cause": "; ".join(filter(None, (shared, cause(run)))),
                       "fails_on_base": shared or None, "run": run,
                       "regression": {"id": reg.id, "state": reg.state, "url": regression_url(base, reg.id)}
                       if reg else None})
    answer = of_suite([c["outcome"] for c in checks])
    verdict = answer.result
    return {
        "id": suite_run.id, "suite": suite.name, "version": suite.version, "environment": suite_run.environment,
        "labels": suite_run.labels, "requester": suite_run.requester, "created_at": suite_run.created_at.isoformat(),
        "state": "running" if verdict == "pending" else "finished",
        # grows with every state change of any of its runs: what a wait asks past (GET .../wait?after=)
        "changes": sum(c["run"]["state_version"] for c in checks),
        "verdict": None if verdict == "pending" else verdict,
        "counts": {k: sum(c["outcome"] == k for c in checks) for k in OUTCOMES},
        "checks": checks,
        "outcome": answer.model_dump(),  # what CI exits with, with and without --strict
        "links": {"self": f"{base}/api/v1/suite-runs/{suite_run.id}", "dashboard": f"{base}/suite-runs/{suite_run.id}"},
    }


PAGE_SIZE = 50


def suite_run_list(session: Session, *, page: int = 1, page_size: int = PAGE_SIZE, branch: str | None = None,
                   suite: str | None = None, base: str = "", prs_only: list[str] | None = None) -> dict[str, Any]:
    """Suite runs newest first, a page at a time, optionally of one branch (label), one suite, or pull requests
    only (prs_only: the long-lived track patterns): each with its suite, build, labels, verdict and counts.

    Two queries per page (the suite runs with their suites, then their runs' states and verdicts), never
    one per suite run: a CI service accumulates thousands of them.
    """
    if suite is not None and session.scalar(select(Suite.id).where(Suite.name == suite).limit(1)) is None:
        known = sorted(set(session.scalars(select(Suite.name))))
        raise NotFound(f"suite: unknown suite {suite!r}; known: {', '.join(known) or 'none'}", field="suite")
    where = []
    if branch is not None:
        where.append(SuiteRun.labels["branch"].astext == branch)
    if suite is not None:
        where.append(Suite.name == suite)
    if prs_only is not None:  # pull requests': a branch label the long-lived track patterns do not name
        where.append(SuiteRun.labels.has_key("branch"))
        where.append(~SuiteRun.labels["branch"].astext.regexp_match(track_regex(prs_only)))
    joined = select(SuiteRun, Suite).join(Suite, Suite.id == SuiteRun.suite_id).where(*where)
    total = session.scalar(select(func.count()).select_from(joined.subquery())) or 0
    pages = max(1, -(-total // page_size))
    page = min(max(1, page), pages)
    rows = session.execute(
        joined.order_by(SuiteRun.created_at.desc(), SuiteRun.id.desc()).offset((page - 1) * page_size).limit(page_size)
    ).all()
    ids = [item["run_id"] for suite_run, _ in rows for item in suite_run.runs]
    shared_text = Run.summary["fails_on_base"].astext
    runs = {r.id: check_result(r.state, r.verdict, r.regression, r.shared)
            for r in session.execute(select(Run.id, Run.state, Run.verdict, Run.regression,
                                            shared_text.label("shared")).where(Run.id.in_(ids)))}
    items = []
    for suite_run, suite_row in rows:
        outcomes = [runs[i["run_id"]] for i in suite_run.runs if i["run_id"] in runs]
        verdict = of_suite(outcomes).result
        items.append({
            "id": suite_run.id, "suite": suite_row.name, "version": suite_row.version,
            "environment": suite_run.environment, "requester": suite_run.requester,
            "created_at": suite_run.created_at, "labels": suite_run.labels,
            "verdict": None if verdict == "pending" else verdict, "checks": len(suite_run.runs),
            "counts": {k: outcomes.count(k) for k in OUTCOMES},
            "links": {"self": f"{base}/api/v1/suite-runs/{suite_run.id}",
                      "dashboard": f"{base}/suite-runs/{suite_run.id}"},
        })
    return {"items": items, "total": total, "page": page, "pages": pages, "page_size": page_size}
