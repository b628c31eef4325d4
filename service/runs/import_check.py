"""A built environment's import check is its first warm worker: the build installs and lists, never imports.

Importing torch and Megatron-Core took most of a build (15-35 s of an uploaded wheel's 17-37 s on a loaded
host), and the suite's first worker imported both again straight after. So a build is ready once installed
and its package list checked (service/environments/recipe.py), its packages say `import_check: pending`, and
the first worker of that environment to finish its imports settles it from what each task wrote
(`imported.rank<r>.json`, jobs/launch/pool_worker.py): passed, with the harness's capabilities recorded as
the build's check recorded them; or failed, and then the environment is failed with the import's error,
its workers are stopped and its runs end in error naming it, as a build whose import check failed did.

A run outside any pool imports in its own phase job, which reports a failed import in its documents.

A report is the build's to write: the worker that writes it has the build's code loaded, and that code can
rewrite any file of its folder. So a report is data to validate (`validate_report`): a field of the wrong
type, a version that is not a short plain string or capabilities that are not a small flat object fail the
check naming the field. Its error text may hold a NUL: the columns it lands in are SafeText
(models/jsonsafe.py), since a refused UPDATE would fail every scheduler pass until the run timed out.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.contract import error_record
from jobs.pool_folder import read_pool_file
from jobs.signature_names import BUILD_IMPORT_CRASH
from models import Environment, Phase, Run
from service.core.phase_state import PHASE_ACTIVE, PhaseState, move_phase
from service.core.run_state import TERMINAL, RunState, can_transition
from service.environments.build_steps import capabilities_shape
from service.environments.registry import IMPORT_CHECK, set_state
from service.executors import pool
from service.runs.evaluation import end_as_the_builds_answer
from service.runs.lifecycle import transition

log = logging.getLogger(__name__)

IMPORT_FAILURE_WHOSE = "import_failure"  # env.packages: "build" (megatron.core did not import) or "service"
Version = Annotated[str, Field(max_length=100, pattern=r"^[^\x00-\x1f\x7f]*$")]


class ImportReport(BaseModel):
    """imported.rank<r>.json as jobs/launch/pool_worker.import_report writes it."""

    model_config = ConfigDict(strict=True, extra="ignore")

    ok: bool
    error: str | None = None  # cut where it is stored, which takes a NUL (SafeText)
    torch: Version | None = None
    megatron_core: Version | None = None
    capabilities: dict[str, Any] | None = None

    @field_validator("capabilities")
    @classmethod
    def _flat(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and not capabilities_shape(value):
            raise ValueError("not a small flat object of flags, numbers, short names and lists of them")
        return value


class MalformedReport(ValueError):
    """An import report that is not what the worker writes; the message names the first bad field."""


def validate_report(value: dict[str, Any]) -> ImportReport:
    """The report as ImportReport, or MalformedReport naming its first bad field (ok needs both versions)."""
    try:
        report = ImportReport.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(report)"
        raise MalformedReport(f"field {field}: {first['msg']}") from None
    if report.ok and not (report.torch and report.megatron_core):
        raise MalformedReport("field torch/megatron_core: required when ok is true")
    return report


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
            reports, error = _reports(worker)
            builds = False
            if error is None:
                error, builds = _error(env, worker, reports)
            if error is not None:
                _fail(session, env, error, builds)
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


def _reports(worker: pool.Worker) -> tuple[list[ImportReport | None], str | None]:
    """Each task's report (None while it is not written), or the error a malformed one makes."""
    reports: list[ImportReport | None] = []
    for rank in range(worker.tasks):
        path = worker.files.imported(rank)
        if not path.exists():  # not written yet (the worker writes it whole: a temporary file renamed)
            reports.append(None)
            continue
        raw = read_pool_file(path)
        if raw is None:  # not a JSON object of at most 64 KiB that could be read without following a link
            return reports, f"the environment's first worker {worker.name} wrote an unreadable {path.name}"
        try:
            reports.append(validate_report(raw))
        except MalformedReport as exc:
            return reports, f"the environment's first worker {worker.name} wrote a malformed {path.name}: {exc}"
    return reports, None


def _error(env: Environment, worker: pool.Worker, reports: list[ImportReport | None]) -> tuple[str | None, bool]:
    """(why the import check failed, or None; whether that is the build's answer: megatron.core itself did not
    import, where torch did — a torch that fails is the shared base's, the service's to fix)."""
    for report in reports:
        if report is None:
            continue
        if not report.ok:
            text = str(report.error)[:2000]
            builds = text.startswith("import megatron") and "import torch:" not in text
            return (f"importing torch and megatron.core failed in the environment's first worker {worker.name}: "
                    f"{text}"), builds
        torch = str(report.torch)
        if env.torch and torch.split("+")[0] != env.torch.split("+")[0]:
            return f"torch {torch} in the build, expected the service's {env.torch}", False
    return None, False


def _passed(env: Environment, reports: list[ImportReport | None]) -> None:
    first = reports[0]
    assert first is not None  # settle passes only when every task has reported
    packages = {**(env.packages or {}), IMPORT_CHECK: "passed"}
    if first.capabilities is not None:  # what the harness detected in the build (jobs/rank/compat.capabilities)
        packages["capabilities"] = first.capabilities  # packages is SafeJSONB: a NUL or a NaN in it is stored
    env.packages = packages
    log.info("environment %s passed its import check (megatron.core %s)", env.name, first.megatron_core)


def _fail(session: Session, env: Environment, error: str, builds: bool) -> None:
    env.error_message = error = error[:4000]
    set_state(env, "failed")
    whose = "build" if builds else "service"
    env.packages = {**(env.packages or {}), IMPORT_CHECK: "failed", IMPORT_FAILURE_WHOSE: whose}
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
        _end(session, run, env)


def fail_runs_on_failed_builds(session: Session) -> int:
    """Queued runs whose environment's build failed end in error, naming the build's error."""
    rows = session.execute(
        select(Run, Environment).join(Environment, Run.environment_id == Environment.id)
        .where(Run.state == RunState.QUEUED.value, Environment.state == "failed")
        .with_for_update(of=Run, skip_locked=True)
    ).all()
    for run, env in rows:
        _end(session, run, env)
    return len(rows)


def _end(session: Session, run: Run, env: Environment) -> None:
    """A run of a failed environment ends as whose the failure is: megatron.core that does not import is the build's
    answer (fail, build-import-crash); an install or a torch that failed is the service's (error)."""
    error = (env.error_message or "")[-2000:]
    run.error_message = f"environment {env.name!r} failed to build: {error}"
    builds = (env.packages or {}).get(IMPORT_FAILURE_WHOSE) == "build"
    if builds and can_transition(run.state, RunState.FAILED.value):  # (a run past its first phase imported it)
        record = error_record("ImportError", error, stage="import")
        end_as_the_builds_answer(session, run, BUILD_IMPORT_CRASH, record,
                                 f"{BUILD_IMPORT_CRASH}: the build's megatron.core does not import: {error[:500]}")
        return
    transition(session, run, RunState.ERROR, f"environment {env.name} failed to build")
