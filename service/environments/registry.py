"""Environments: which Python runs the job phases (so CI can test another Megatron-Core build).

An environment is registered (a Python someone prepared; checked here before it is stored) or
built by the service from requirement lines (`request_build`; the scheduler builds it as a job).
The `python` of either reaches an sbatch script, so it must be a plain absolute path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import ApiToken, Environment, Track
from models.base import utcnow
from service.artifacts.store import resolve_lines
from service.core.errors import Conflict, DomainError, Forbidden, NotFound, QuotaExceeded
from service.core.settings import Settings
from service.core.tracks import may_write
from service.environments import interpreters
from service.environments.requirements import RequirementError, content_hash, normalize

DEFAULT_ENVIRONMENT = "default"
# No whitespace, quotes or shell metacharacters: the path is also quoted where used, but a path
# that needs quoting is refused outright so no script ever depends on getting that right.
SAFE_PYTHON = re.compile(r"^/[A-Za-z0-9._+\-/]{1,999}$")
INSPECT_TIMEOUT_S = 180
LAST_USED_RESOLUTION = timedelta(minutes=1)
# The pip freeze is taken before torch is imported: importing it puts setuptools' vendored packages on
# sys.path, which would show as a difference between two identical environments. First one on the path
# wins, as for an import.
FREEZE = (
    "f = {}\n"
    "for d in md.distributions():\n"
    "    n = d.metadata['Name']\n"
    "    if n and '_vendor' not in str(d.locate_file('')):\n"
    "        f.setdefault(n.lower(), d.version)\n"
    "freeze = sorted('%s==%s' % kv for kv in f.items())\n"
)
INSPECT = (
    "import json, sys, importlib.metadata as md\n" + FREEZE + "import torch, megatron.core\n"
    "print(json.dumps({'torch': torch.__version__, 'megatron_core': megatron.core.__version__, "
    "'python_version': '%d.%d.%d' % sys.version_info[:3], 'freeze': freeze}))"
)
# A build is ready once installed and its package list checked; its first warm worker imports it
# (service/runs/import_check.py): packages[IMPORT_CHECK] is "pending" until then, "passed" or "failed" after.
IMPORT_CHECK = "import_check"
# Builds move forward only (ready -> failed: its import check failed); a failed or pruned build is built
# again when someone asks for it.
ENV_TRANSITIONS = {
    "pending": {"building", "failed"},
    "building": {"ready", "failed", "pending"},
    "ready": {"pruned", "failed"},
    "failed": {"pending"},
    "pruned": {"pending"},
}


class InvalidEnvironment(DomainError):
    status_code = 422
    code = "invalid_environment"


def set_state(env: Environment, state: str) -> None:
    """Move a built environment to `state` along ENV_TRANSITIONS (409 otherwise)."""
    if state not in ENV_TRANSITIONS.get(env.state, set()):
        raise Conflict(f"state: environment {env.name!r} cannot go from {env.state} to {state}", field="state")
    env.state = state


def check_python_path(python: str) -> str:
    """The path if it is an absolute path to an executable file with no shell metacharacters."""
    if not SAFE_PYTHON.match(python):
        raise InvalidEnvironment(
            f"python: {python[:200]!r} must be an absolute path of letters, digits and ._+-/ "
            "(no whitespace, quotes or shell metacharacters)",
            field="python",
        )
    # the mode bits, not os.access: for root, access(X_OK) says yes to files nobody may execute
    if not (os.path.isfile(python) and os.stat(python).st_mode & 0o111 and os.access(python, os.X_OK)):
        raise InvalidEnvironment(f"python: {python!r} is not an existing executable file", field="python")
    return python


def inspect_python(python: str) -> dict[str, Any]:
    """Run python once: it must import torch and megatron.core; return their versions and its pip freeze."""
    check_python_path(python)
    try:
        proc = subprocess.run(
            [python, "-c", INSPECT], capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S,
            env={k: v for k, v in os.environ.items() if not k.startswith("PARITY_")},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InvalidEnvironment(f"python: {python!r} could not be run: {exc}", field="python") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InvalidEnvironment(
            f"python: {python!r} cannot import torch and megatron.core: {tail[0][:300]}", field="python"
        )
    # the last line must be the JSON INSPECT prints: a Python that prints nothing (or anything else) is refused
    lines = proc.stdout.strip().splitlines()
    try:
        versions = json.loads(lines[-1]) if lines else None
    except ValueError:
        versions = None
    if not isinstance(versions, dict) or not all(isinstance(versions.get(k), str) for k in ("torch", "megatron_core")):
        raise InvalidEnvironment(
            f"python: {python!r} ran but did not report torch and megatron.core versions "
            f"(printed {(lines[-1] if lines else 'nothing')[:200]!r})", field="python")
    out: dict[str, Any] = {"torch": versions["torch"], "megatron_core": versions["megatron_core"]}
    if isinstance(versions.get("python_version"), str):
        out["python_version"] = versions["python_version"][:40]
    freeze = versions.get("freeze")
    if isinstance(freeze, list) and all(isinstance(line, str) for line in freeze):
        out["freeze"] = [line[:500] for line in freeze[:5000]]  # what triage diffs between two runs
    return out


def get_environment(session: Session, *, name: str) -> Environment:
    """The environment called name, or 404."""
    env = session.scalar(select(Environment).where(Environment.name == name))
    if env is None:
        raise NotFound(f"environment: unknown environment {name!r}", field="environment")
    return env


def ensure_default_environment(session: Session, *, settings: Settings) -> Environment:
    """The default environment (the service's own Python unless PARITY_JOB_PYTHON says otherwise)."""
    query = select(Environment).where(Environment.name == DEFAULT_ENVIRONMENT)
    env = session.scalar(query)
    if env is None:
        # Two first requests race to create it: ON CONFLICT makes the loser wait for the winner's
        # commit and then read its row (a plain INSERT was a UniqueViolation, a 500, for the loser).
        own = {} if settings.job_python else own_python()  # another python is inspected by nobody here
        session.execute(
            insert(Environment).values(
                name=DEFAULT_ENVIRONMENT, python=settings.job_python or sys.executable,
                description="The Python the service itself runs with", packages=own.get("packages", {}),
                megatron_core=own.get("megatron_core"), torch=own.get("torch"), freeze=own.get("freeze", []),
            ).on_conflict_do_nothing(index_elements=["name"])
        )
        env = session.scalar(query.execution_options(populate_existing=True))
        assert env is not None
    if env.megatron_core is None and not settings.job_python and env.python == sys.executable:
        own = own_python()  # a row made before versions were recorded showed Megatron-Core "?"
        env.megatron_core, env.torch, env.freeze = own["megatron_core"], own["torch"], own["freeze"]
        env.packages = {**(env.packages or {}), **own["packages"]}
    return env


# The name the service gives a nameless build (`build-<12 hex>`, predictable from public requirement lines):
# a client that took one first would make the service's own build a 409. (A source's commit builds,
# `<source>@<commit>`, a watched track's runs, carry an @ that no client's name may hold: EnvironmentIn.)
SERVICE_NAMED = re.compile(r"^build-[0-9a-f]{12}")


def check_name_claim(session: Session, name: str, token: ApiToken | None) -> None:
    """403 when a (non-admin) token names a build with a name that is not its to take.

    An environment's name is a track (a run with no branch label writes the track of its environment's
    name) and `default` is what every run that names no environment runs on: a name is taken only by a
    token that may write that track, never `default`, a watched track's name or a name of the service's.
    """
    if token is None or "admin" in token.scopes:
        return
    why = None
    if name == DEFAULT_ENVIRONMENT:
        why = "is the environment every run without one runs on (an admin's)"
    elif SERVICE_NAMED.search(name):
        why = "has the form of a name the service gives builds (build-<hash>)"
    elif session.scalar(select(Track.id).where(Track.name == name)) is not None:
        why = "is a watched track's name"
    elif not may_write(token, name):
        allowed = ", ".join(repr(p) for p in token.tracks or ()) or "none"
        why = f"is a track this token may not write (its tracks: {allowed})"
    if why:
        raise Forbidden(f"name: {name[:200]!r} {why}; leave name out (the build is called build-<hash>) or "
                        "ask an admin", field="name")


def _unique_name(session: Session, name: str) -> None:
    if session.scalar(select(Environment.id).where(Environment.name == name)) is not None:
        raise Conflict(f"name: environment {name!r} already exists", field="name")


def create_environment(
    session: Session, *, name: str, python: str, description: str = "", packages: dict[str, Any] | None = None
) -> Environment:
    """Register a hand-made environment (path checked; call inspect_python first for its versions)."""
    _unique_name(session, name)
    packages = dict(packages or {})
    freeze = list(packages.pop("freeze", None) or [])  # kept apart: triage diffs it between two runs
    env = Environment(
        name=name, python=check_python_path(python), description=description, packages=packages,
        megatron_core=packages.get("megatron_core"), torch=packages.get("torch"), freeze=freeze,
    )
    session.add(env)
    session.flush()
    return env


def builds_folder(settings: Settings) -> Path:
    """Where built virtualenvs live: beside the run folders, so every Slurm node sees them."""
    return settings.resolved_run_folder / "environments"


UNFINISHED_BUILD = ("pending", "building")


def _charge_build(session: Session, token: ApiToken | None, settings: Settings) -> None:
    """Count a build this token starts against PARITY_TOKEN_MAX_BUILDS (429 naming it when full; admin: none)."""
    if token is None or "admin" in token.scopes:
        return
    session.execute(select(ApiToken.id).where(ApiToken.id == token.id).with_for_update())  # one count at a time
    busy = session.scalar(select(func.count()).select_from(Environment).where(
        Environment.token_id == token.id, Environment.state.in_(UNFINISHED_BUILD))) or 0
    if busy >= settings.token_max_builds:
        raise QuotaExceeded(
            f"requirements: token {token.name!r} already has {busy} builds pending or building "
            f"(PARITY_TOKEN_MAX_BUILDS={settings.token_max_builds}); ask again when one has finished",
            field="requirements")


def request_build(
    session: Session, *, requirements: list[str], settings: Settings, name: str | None = None, description: str = "",
    token: ApiToken | None = None,
) -> tuple[Environment, bool]:
    """The build of these requirement lines: reused when an identical set exists, else queued. -> (env, new).

    A build that has to run (new, or failed/pruned before) counts in `token`'s build quota.
    """
    try:
        lines = normalize(requirements)
        torch_version = _service_torch()
        # the Python a build gets depends on the configured set: a new set is a new build
        digest = content_hash(lines, torch_version=torch_version, python_version=_python_versions(settings))
    except RequirementError as exc:
        raise InvalidEnvironment(str(exc), field=exc.field) from None
    resolve_lines(session, lines)  # every uploaded artifact must be there (422 naming the line otherwise)
    env = session.scalar(select(Environment).where(Environment.content_hash == digest).with_for_update())
    if env is not None:
        if name is not None and name != env.name:
            raise Conflict(
                f"name: these requirements are already built as environment {env.name!r}", field="name"
            )
        if env.state in ("failed", "pruned"):
            _charge_build(session, token, settings)
            set_state(env, "pending")
            env.error_message, env.job_id = None, None
            env.token_id = token.id if token else None
        env.last_used_at = utcnow()
        return env, False
    if name is not None:
        check_name_claim(session, name, token)
    name = name or f"build-{digest[:12]}"
    _unique_name(session, name)
    _charge_build(session, token, settings)
    folder = builds_folder(settings) / digest[:16]
    env = Environment(
        name=name, python=str(folder / "venv" / "bin" / "python"), description=description, packages={},
        state="pending", requirements=lines, content_hash=digest, folder=str(folder), torch=torch_version,
        freeze=[], last_used_at=utcnow(), token_id=token.id if token else None,
    )
    session.add(env)
    session.flush()
    return env, True


def use_environment(env: Environment) -> Environment:
    """Mark env used by a new run: a failed build is refused, a pruned one is queued to build again."""
    if env.state == "failed":
        raise Conflict(
            f"environment: {env.name!r} failed to build: {(env.error_message or '')[-500:]}", field="environment"
        )
    if env.state == "pruned":
        set_state(env, "pending")
        env.job_id = None
    # At most once a minute: every POST rewriting the same environment row made concurrent POSTs
    # queue on its row lock until each one committed (pruning counts in days, so a minute is exact enough).
    now = utcnow()
    if env.last_used_at is None or now - env.last_used_at > LAST_USED_RESOLUTION:
        env.last_used_at = now
    return env


def own_python() -> dict[str, Any]:
    """The service's own Python described without importing torch: versions and pip freeze (metadata only)."""
    from importlib import metadata as md

    scope: dict[str, Any] = {"md": md}
    exec(FREEZE, scope)  # the same freeze as a registered environment's (INSPECT)
    freeze: list[str] = scope["freeze"]
    versions = {n.lower(): v for n, _, v in (line.partition("==") for line in freeze)}
    out: dict[str, Any] = {"megatron_core": versions.get("megatron-core"), "torch": versions.get("torch"),
                           "freeze": freeze}
    out["packages"] = {k: v for k, v in (("megatron_core", out["megatron_core"]), ("torch", out["torch"]),
                                         ("python_version", ".".join(map(str, sys.version_info[:3])))) if v}
    return out


def _service_torch() -> str:
    from importlib.metadata import version

    return version("torch")


def _python_versions(settings: Settings) -> str:
    try:
        return interpreters.versions_key(interpreters.configured(settings.pythons))
    except interpreters.PythonsError as exc:
        raise InvalidEnvironment(str(exc), field="PARITY_PYTHONS") from None


def list_environments(session: Session) -> list[Environment]:
    """All environments, by name."""
    return list(session.scalars(select(Environment).order_by(Environment.name)))
