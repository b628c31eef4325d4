"""Scheduler steps for built environments: launch pending builds, reconcile them, prune unused ones.

A build is one submitit job (local or Slurm, like the phases) running `recipe.build_environment`
with the service's own Python. Its folder is fixed when the row is made, and a job already
submitted from it is adopted, never submitted twice (the same rule as phases).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from jobs.protocol import UnreadableDocument, read_job_file
from models import Environment, Run
from models.base import utcnow
from service.artifacts.lines import artifact_sha
from service.artifacts.store import resolve_lines
from service.core.errors import DomainError
from service.core.run_state import TERMINAL
from service.core.settings import Settings, get_settings
from service.environments import interpreters
from service.environments.recipe import RESULT_NAME, build_environment
from service.environments.registry import IMPORT_CHECK, set_state
from service.executors import job_leases, job_user, launcher
from service.executors.selection import pick_executor

log = logging.getLogger(__name__)
MAX_RESULT_BYTES = 16 * 1024 * 1024  # a pip freeze of a few hundred lines is a few KB


def _job(env: Environment) -> launcher.PhaseJob:
    return launcher.PhaseJob(executor=env.executor or "local", folder=str(Path(env.folder or "") / "job"),
                             job_id=env.job_id or "", tasks=1)


def pip_environment() -> frozenset[str]:
    """Names of the variables pip needs in a build job (its config, proxies, CA bundles), never secrets."""
    keep = ("PIP_", "UV_")
    names = {"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "XDG_CONFIG_DIRS", "XDG_CACHE_HOME",
             "GIT_SSL_CAINFO"}
    return frozenset(k for k in os.environ if k.startswith(keep) or k.lower().endswith("_proxy") or k in names)


UPLOADS = "uploads"  # a build folder's copies of the artifacts it installs


def own_copies(folder: Path, lines: list[str], resolved: list[str]) -> list[str]:
    """`resolved` with each uploaded artifact's stored path replaced by a copy in folder/uploads.

    Stored artifacts are the service's only (0600): a job user, whichever tenant's job it runs, reads no
    upload but the ones its own build installs, which it gets here. Made by directory descriptor, never
    through a link an earlier attempt's job left in its folder; what is there is replaced.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            if stat.S_ISDIR(os.stat(UPLOADS, dir_fd=top, follow_symlinks=False).st_mode):
                shutil.rmtree(UPLOADS, dir_fd=top)
            else:
                os.unlink(UPLOADS, dir_fd=top)
        except FileNotFoundError:
            pass
        os.mkdir(UPLOADS, 0o700, dir_fd=top)
        uploads = os.open(UPLOADS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        try:
            out = []
            for line, path in zip(lines, resolved, strict=True):
                sha = artifact_sha(line.strip())
                if sha is None:
                    out.append(path)
                    continue
                name = Path(path).name
                os.mkdir(sha, 0o700, dir_fd=uploads)
                inner = os.open(sha, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=uploads)
                try:
                    dest = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=inner)
                    with open(path, "rb") as src, os.fdopen(dest, "wb") as fh:
                        shutil.copyfileobj(src, fh)
                finally:
                    os.close(inner)
                out.append(str(folder / UPLOADS / sha / name))
            return out
        finally:
            os.close(uploads)
    finally:
        os.close(top)


def launch_builds(session: Session, *, settings: Settings, executor: str | None = None, limit: int = 2) -> int:
    """Submit (or adopt) up to `limit` pending builds on `executor` (default: settings'). Returns how many."""
    executor = executor or pick_executor(settings)
    envs = session.scalars(
        select(Environment).where(Environment.state == "pending").order_by(Environment.id).limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    for env in envs:
        folder = Path(env.folder or "")
        job_folder = folder / "job"
        job_id = launcher.find_submitted(job_folder)
        if job_id is None:
            if job_folder.exists():  # a previous (failed) attempt's files: start clean
                shutil.rmtree(job_folder)
            try:  # the job installs uploaded artifacts from copies in its own folder (the store is the service's)
                lines = own_copies(folder, list(env.requirements or []),
                                   resolve_lines(session, list(env.requirements or [])))
            except DomainError as exc:
                env.error_message = exc.detail
                set_state(env, "failed")
                continue
            try:  # the Pythons it may choose from: resolved here, where PARITY_PYTHONS is set
                pythons = interpreters.configured(settings.pythons)
            except interpreters.PythonsError as exc:
                env.error_message = str(exc)
                set_state(env, "failed")
                continue
            try:
                job = launcher.submit_phase(launcher.JobRequest(
                    executor=executor, folder=job_folder, python=sys.executable, tasks=1,
                    name=f"parity-env-{env.id}", function=build_environment,
                    args=(str(folder), lines, pythons), env_names=pip_environment(), network=True,
                ), settings)
            except job_leases.NoFreeJobUser as exc:  # every job user serves a live job: build later
                log.info("build %s waits: %s", env.id, exc)
                continue
            except Exception as exc:  # sbatch refused: the build cannot start, say why
                env.error_message = f"submitting the build failed: {exc}"[-4000:]
                set_state(env, "failed")
                continue
            env.executor, job_id = job.executor, job.job_id
        env.executor = env.executor or executor
        env.job_id = job_id
        set_state(env, "building")
    return len(envs)


def reconcile_builds(session: Session, settings: Settings | None = None) -> int:
    """Finish builds whose job ended: ready with packages, or failed with pip's error. Returns how many.

    A build folder is the job user's while its job runs (PARITY_JOB_USER) and the service's again
    before its result is read; a build past PARITY_RUN_DISK_QUOTA is stopped and fails saying so.
    """
    settings = settings or get_settings()
    envs = session.scalars(
        select(Environment).where(Environment.state == "building").with_for_update(skip_locked=True)
    ).all()
    jobs = {env.id: _job(env) for env in envs}
    states = launcher.poll(list(jobs.values())) if jobs else {}
    done = 0
    for env in envs:
        status = states[jobs[env.id]]
        over = _over_quota(env, settings)
        if over:
            launcher.cancel(jobs[env.id])
            _take_back(env, settings)
            env.error_message = f"{over}; infrastructure failure, not the requirements' fault"
            set_state(env, "failed")
            done += 1
            continue
        if status.kind in ("active", "running"):
            continue
        done += 1
        _take_back(env, settings)
        # a build that crashed still leaves its error in its result document: read it whatever sacct says
        doc, error = _result(env, jobs[env.id]) if status.kind in ("done", "failed") else (
            None, f"build job {status.raw}")
        if doc is None:
            env.error_message = error
            set_state(env, "failed")
            continue
        env.python, env.freeze = doc["python"], doc["freeze"]
        env.megatron_core, env.torch = doc["megatron_core"], doc["torch"]
        env.packages = {"torch": doc["torch"], "megatron_core": doc["megatron_core"]}
        if doc.get("python_version"):  # the Python the build chose (older builds did not say)
            env.packages["python_version"] = doc["python_version"]
        if doc.get("capabilities"):  # what the harness detected in the build (jobs/rank/compat.capabilities)
            env.packages["capabilities"] = doc["capabilities"]
        if doc.get(IMPORT_CHECK) == "pending":  # its first warm worker imports it (service/runs/import_check.py)
            env.packages[IMPORT_CHECK] = "pending"
        env.build_seconds, env.built_at, env.error_message = doc["seconds"], utcnow(), None
        set_state(env, "ready")
    return done


def _take_back(env: Environment, settings: Settings) -> None:
    launcher.end_job(_job(env), settings)  # nothing the build started outlives it (a local job's cgroup)
    try:
        run_as = job_user.job_user(settings.job_user)
    except job_user.JobUserError as exc:
        log.warning("not taking back build folder %s: %s", env.folder, exc)
        return
    if env.folder:
        job_user.take_back(Path(env.folder), run_as, root=settings.resolved_run_folder)
        job_leases.release(settings, Path(env.folder))  # its user serves the next job (end_job killed the rest)


def _over_quota(env: Environment, settings: Settings) -> str | None:
    limit = settings.run_disk_quota_bytes
    used = job_user.folder_bytes(Path(env.folder or ""), limit=limit) if env.folder else 0
    if used <= limit:
        return None
    return (f"disk quota exceeded: the build folder holds more than {used} bytes, past "
            f"PARITY_RUN_DISK_QUOTA={settings.run_disk_quota} ({limit} bytes)")


def _result(env: Environment, job: launcher.PhaseJob) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return read_build_result(Path(env.folder or "")), None
    except BuildResultError as exc:
        return None, f"{exc}\n{launcher.failure_text(job)}"[-6000:]


class BuildResultError(ValueError):
    """The build job left no usable outcome document (or one saying it failed)."""


def read_build_result(folder: Path) -> dict[str, Any]:
    """The outcome the build job wrote (recipe.RESULT_NAME), read as bounded JSON and checked field by field.

    A build runs code nobody reviewed: its document is data to validate, and the interpreter it
    names must be the one inside its own folder.
    """
    try:
        doc = json.loads(read_job_file(folder / RESULT_NAME, MAX_RESULT_BYTES))
    except FileNotFoundError:
        raise BuildResultError("the build job ended without writing its result") from None
    except (UnreadableDocument, OSError, ValueError) as exc:
        raise BuildResultError(f"the build's result is unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise BuildResultError("the build's result is not a JSON object")
    if isinstance(doc.get("error"), str):
        raise BuildResultError(doc["error"])
    expected = str(folder / "venv" / "bin" / "python")
    if doc.get("python") != expected:
        raise BuildResultError(f"the build's result names python {str(doc.get('python'))[:200]!r}, not {expected}")
    for key in ("torch", "megatron_core"):
        if not isinstance(doc.get(key), str) or len(doc[key]) > 100 or not doc[key].isprintable():
            raise BuildResultError(f"the build's result: {key} is not a version string")
    if doc.get(IMPORT_CHECK, "pending") != "pending":
        raise BuildResultError(f"the build's result: {IMPORT_CHECK} is not 'pending'")
    if not isinstance(doc.get("python_version", ""), str) or len(doc.get("python_version", "")) > 40:
        raise BuildResultError("the build's result: python_version is not a version string")
    freeze = doc.get("freeze")
    if not isinstance(freeze, list) or not all(isinstance(x, str) and len(x) < 2000 for x in freeze):
        raise BuildResultError("the build's result: freeze is not a list of requirement lines")
    if not isinstance(doc.get("seconds"), (int, float)):
        raise BuildResultError("the build's result: seconds is not a number")
    if not capabilities_shape(doc.get("capabilities", {})):
        raise BuildResultError("the build's result: capabilities is not a small object of flags, names and lists")
    return doc


def capabilities_shape(caps: Any) -> bool:
    """A flat object of at most 40 short keys, each a bool, number, short string or list of short strings."""
    if not isinstance(caps, dict) or len(caps) > 40:
        return False
    for key, value in caps.items():
        if not isinstance(key, str) or len(key) > 60:
            return False
        if isinstance(value, list):
            if len(value) > 40 or not all(isinstance(v, str) and len(v) <= 100 for v in value):
                return False
        elif isinstance(value, str):
            if len(value) > 300:
                return False
        elif value is not None and not isinstance(value, (bool, int, float)):
            return False
    return True


def prune_builds(session: Session, *, keep_days: float) -> list[str]:
    """Delete the virtualenvs of ready builds no run has used for keep_days; returns their names."""
    cutoff = utcnow() - timedelta(days=keep_days)
    busy = exists().where(Run.environment_id == Environment.id, Run.state.not_in([s.value for s in TERMINAL]))
    envs = session.scalars(
        select(Environment).where(
            Environment.state == "ready", Environment.requirements.is_not(None),
            Environment.last_used_at < cutoff, ~busy,
        ).with_for_update(skip_locked=True)
    ).all()
    for env in envs:
        if env.folder:
            shutil.rmtree(env.folder, ignore_errors=True)
        set_state(env, "pruned")
        log.info("pruned environment %s (unused since %s)", env.name, env.last_used_at)
    return [e.name for e in envs]
