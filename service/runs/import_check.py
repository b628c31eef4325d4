"""A built environment's import check is its first warm worker: the build installs and lists, never imports.

Importing torch and Megatron-Core took most of a build (15-35 s of an uploaded wheel's 17-37 s on a loaded
host), and the suite's first worker imported both again straight after. So a build is ready once installed
and its package list checked (service/environments/recipe.py), its packages say `import_check: pending`, and
the first worker of that environment to finish its imports settles it from what each task wrote
(`imported.rank<r>.json`, jobs/launch/pool_worker.py): passed, with the harness's capabilities recorded as
the build's check recorded them; or failed, and then the environment is failed with the import's error,
its workers are stopped and its runs end in error naming it, as a build whose import check failed did.

A run outside any pool imports in its own phase job, which reports a failed import in its documents.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.pool_folder import read_pool_file
from models import Environment, Phase, Run
from service.core.phase_state import PHASE_ACTIVE, PhaseState, move_phase
from service.core.run_state import TERMINAL, RunState, transition
from service.environments.build_steps import fail_runs_on_failed_builds
from service.environments.registry import IMPORT_CHECK, set_state
from service.executors import pool

log = logging.getLogger(__name__)


def settle(session: Session, views: list[pool.WorkerView]) -> list[int]:
    """Settle the import check of every environment a worker has finished importing; the ids of the failed."""
    workers: dict[int, list[pool.Worker]] = {}
    for v in views:
        if v.state != "retired":
            workers.setdefault(v.worker.key[0], []).append(v.worker)
    if not workers:
        return []
    envs = session.scalars(
        select(Environment).where(Environment.id.in_(workers), Environment.state == "ready")
        .with_for_update(skip_locked=True)
    ).all()
    failed = []
    for env in envs:
        if (env.packages or {}).get(IMPORT_CHECK) != "pending":
            continue
        for worker in workers[env.id]:
            reports = [read_pool_file(worker.files.imported(rank)) for rank in range(worker.tasks)]
            error = _error(env, worker, reports)
            if error is not None:
                _fail(session, env, error)
                for other in workers[env.id]:
                    pool.retire(other, "its environment failed its import check", hard=True)
                failed.append(env.id)
                break
            if all(r is not None for r in reports):
                _passed(env, reports)
                break
    if failed:
        fail_runs_on_failed_builds(session)  # its queued runs, as for a failed build
    return failed


def _error(env: Environment, worker: pool.Worker, reports: list[dict[str, Any] | None]) -> str | None:
    for report in reports:
        if report is None:
            continue
        if report.get("ok") is not True:
            return (f"importing torch and megatron.core failed in the environment's first worker {worker.name}: "
                    f"{str(report.get('error'))[:2000]}")
        torch = str(report.get("torch"))
        if env.torch and torch.split("+")[0] != env.torch.split("+")[0]:
            return f"torch {torch[:100]} in the build, expected the service's {env.torch}"
    return None


def _passed(env: Environment, reports: list[dict[str, Any] | None]) -> None:
    first = reports[0] or {}
    packages = {**(env.packages or {}), IMPORT_CHECK: "passed"}
    caps = first.get("capabilities")
    if isinstance(caps, dict):  # what the harness detected in the build (jobs/rank/compat.capabilities)
        packages["capabilities"] = caps
    env.packages = packages
    log.info("environment %s passed its import check (megatron.core %s)", env.name, first.get("megatron_core"))


def _fail(session: Session, env: Environment, error: str) -> None:
    env.error_message = error
    set_state(env, "failed")
    env.packages = {**(env.packages or {}), IMPORT_CHECK: "failed"}
    log.warning("environment %s failed its import check: %s", env.name, error)
    runs = session.scalars(
        select(Run).where(Run.environment_id == env.id, Run.state.not_in([s.value for s in TERMINAL]),
                          Run.state != RunState.QUEUED.value).with_for_update(skip_locked=True)
    ).all()
    for run in runs:
        phases = session.scalars(select(Phase).where(Phase.run_id == run.id)).all()
        if any(PhaseState(p.state) in PHASE_ACTIVE for p in phases) or run.state == RunState.EVALUATING.value:
            continue  # a job of it is out: it imports the same build and ends on its own documents
        for phase in phases:
            if phase.state == PhaseState.PENDING.value:
                move_phase(session, phase, PhaseState.ERROR, "its environment failed its import check")
        run.error_message = f"environment {env.name!r} failed to build: {error[-2000:]}"
        transition(session, run, RunState.ERROR, f"environment {env.name} failed its import check")
