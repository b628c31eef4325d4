"""Sources: Megatron-LM code at a ref, resolved to a commit and built as one environment per commit.

A source is a git URL (kept as a bare mirror under `<run folder>/sources/`), a local git repository
(read in place) or a plain source tree (named by a hash of its content). Resolving, listing commits
and exporting a tree run git here, in the scheduler or an admin's request, never in the build job:
the job gets a `git archive` of the commit in its build folder as its one local-path requirement
line, so the ordinary build path (recipe.py: pip on the Python Requires-Python asks for, as the job
user) builds it. The environment is keyed by the commit (with the recipe, Pythons and torch), so a
commit that repeats reuses its build whichever source or track names it.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Environment, Source
from models.base import utcnow
from service.core.errors import Conflict, DomainError, InvalidSpec, NotFound
from service.core.settings import Settings
from service.environments.registry import _python_versions, _service_torch, builds_folder, set_state
from service.environments.requirements import RECIPE_VERSION, SKIP_PARTS, local_source_digest

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/\-]{0,199}$")
URL = re.compile(r"^(https://|ssh://|file://|git@)[A-Za-z0-9._~:/%@+\-]{1,990}$")
LOCAL = re.compile(r"^/[A-Za-z0-9._+\-/]{1,999}$")
SHA = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")
GIT_TIMEOUT_S = 600
MAX_COMMITS = 1000


class SourceError(DomainError):
    """git could not resolve, list or export what the source names (status 422: the source is wrong)."""

    status_code = 422
    code = "source_error"


@dataclass(frozen=True)
class Commit:
    """A resolved commit: its sha (a tree's: sha256 of its content), committer date and subject line."""

    sha: str
    date: datetime | None
    subject: str

    def to_dict(self) -> dict[str, Any]:
        """As stored in a bisect's commit list."""
        return {"sha": self.sha, "date": self.date.isoformat() if self.date else None, "subject": self.subject}


def register_source(session: Session, *, name: str, location: str, ref: str | None,
                    created_by: str | None = None) -> Source:
    """Store a source (admin): a git URL or local repository with a ref, or a local tree without one.

    Only the shapes are checked here; git reads the source when a track or bisect first resolves it.
    """
    if not NAME.match(name):
        raise InvalidSpec("name: 1..100 of a-z, 0-9, '.', '_', '-'", field="name")
    if ref is not None and (not REF.match(ref) or ".." in ref):
        raise InvalidSpec(f"ref: {ref[:200]!r} is not a branch, tag or commit name", field="ref")
    if URL.match(location):
        kind, ref = "git", ref or "main"
    elif LOCAL.match(location) and ".." not in location.split("/"):
        kind = "git" if ref else "tree"  # a local repository names its ref; a plain tree has none
    else:
        raise InvalidSpec("location: a git URL (https://, ssh://, file://, git@) or an absolute local path "
                          "without whitespace or '..'", field="location")
    if session.scalar(select(Source.id).where(Source.name == name)) is not None:
        raise Conflict(f"name: source {name!r} already exists", field="name")
    source = Source(name=name, kind=kind, location=location, ref=ref, created_by=created_by)
    session.add(source)
    session.flush()
    return source


def get_source(session: Session, name: str) -> Source:
    """The source called name, or 404."""
    source = session.scalar(select(Source).where(Source.name == name))
    if source is None:
        raise NotFound(f"source: unknown source {name!r}", field="source")
    return source


def list_sources(session: Session) -> list[Source]:
    """Every source, by name."""
    return list(session.scalars(select(Source).order_by(Source.name)))


def _git(args: list[str], *, cwd: Path | None = None, stdout_bytes: bool = False) -> Any:
    # safe.directory: the repository belongs to whoever registered it, not to the scheduler's user
    cmd = ["git", "-c", "safe.directory=*", *args]
    # the service's own environment (ssh keys, proxies, CA bundles reach a fetch), never its PARITY_* secrets;
    # never a prompt for credentials: a source that needs them fails with git's message
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_PAGER="cat")
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceError(f"git {args[0]}: {exc}", field="source") from None
    if proc.returncode != 0:
        raise SourceError(f"git {' '.join(args[:3])}: {proc.stderr.decode(errors='replace').strip()[-500:]}",
                          field="source")
    return proc.stdout if stdout_bytes else proc.stdout.decode(errors="replace")


def git_dir(source: Source, settings: Settings) -> Path:
    """The repository git reads: the local one, or a bare mirror of the URL, fetched now."""
    if source.kind != "git":
        raise SourceError(f"source {source.name!r} is a plain tree: it has no commits", field="source")
    if source.location.startswith("/"):
        return Path(source.location)
    mirror = settings.resolved_run_folder / "sources" / f"{source.name}.git"
    if not (mirror / "HEAD").exists():
        mirror.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(mirror, ignore_errors=True)
        _git(["clone", "--mirror", "--quiet", source.location, str(mirror)])
    else:
        _git(["fetch", "--quiet", "--prune", "origin"], cwd=mirror)
    return mirror


def _commit(repo: Path, ref: str) -> Commit:
    out = _git(["log", "-1", "--no-walk", "--format=%H%x00%cI%x00%s", f"{ref}^{{commit}}", "--"], cwd=repo)
    sha, date, subject = out.strip().split("\x00", 2)
    return Commit(sha=sha, date=datetime.fromisoformat(date), subject=subject[:500])


def resolve(source: Source, settings: Settings, ref: str | None = None) -> Commit:
    """The commit the source's ref (or `ref`) names now; a tree: the hash of its content, dated now."""
    if source.kind == "tree":
        try:
            digest = local_source_digest(Path(source.location))
        except (OSError, ValueError) as exc:
            raise SourceError(f"source {source.name!r}: {exc}", field="source") from None
        return Commit(sha=digest, date=utcnow(), subject=f"source tree {source.location}")
    return _commit(git_dir(source, settings), ref or source.ref or "HEAD")


def commits_between(source: Source, settings: Settings, good: str, bad: str) -> list[Commit]:
    """The commits after good up to bad (bad included), oldest first, along bad's first-parent line."""
    repo = git_dir(source, settings)
    out = _git(["log", "--reverse", "--first-parent", "--ancestry-path", "--format=%H%x00%cI%x00%s",
                f"{good}..{bad}", "--"], cwd=repo)
    commits = []
    for line in out.splitlines():
        sha, date, subject = line.split("\x00", 2)
        commits.append(Commit(sha=sha, date=datetime.fromisoformat(date), subject=subject[:500]))
    if not commits or commits[-1].sha != _commit(repo, bad).sha:
        raise SourceError(f"bisect: {bad[:12]} does not descend from {good[:12]} on source {source.name!r}",
                          field="bad")
    if len(commits) > MAX_COMMITS:
        raise SourceError(f"bisect: {len(commits)} commits between, at most {MAX_COMMITS}", field="bad")
    return commits


def export_tree(source: Source, settings: Settings, sha: str, dest: Path) -> None:
    """Put the commit's files (a tree source: its files) at dest, replacing what was there."""
    if dest.exists():
        shutil.rmtree(dest)
    if source.kind == "tree":
        shutil.copytree(source.location, dest, symlinks=True,
                        ignore=shutil.ignore_patterns(*SKIP_PARTS, "*.egg-info"))
        return
    data = _git(["archive", "--format=tar", sha], cwd=git_dir(source, settings), stdout_bytes=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")  # no absolute paths, no links out of dest


def commit_hash(sha: str, settings: Settings) -> str:
    """The environment key of a commit: recipe, Pythons, torch and the commit (not the source's name)."""
    text = (f"recipe={RECIPE_VERSION}\npython={_python_versions(settings)}\ntorch={_service_torch()}\n"
            f"source-commit={sha}\n")
    return hashlib.sha256(text.encode()).hexdigest()


def environment_name(source: Source, sha: str) -> str:
    """How a commit's build is named: <source>@<12 hex digits>."""
    return f"{source.name}@{sha[:12]}"


def find_commit_environment(session: Session, sha: str, settings: Settings) -> Environment | None:
    """The build of this commit, if one was made."""
    return session.scalar(select(Environment).where(Environment.content_hash == commit_hash(sha, settings)))


def commit_environment(session: Session, *, source: Source, commit: Commit, settings: Settings) -> Environment:
    """The build of this commit: reused when the commit repeats (a failed or pruned one queued again),
    else made now, its tree exported into its build folder and its build queued for the scheduler."""
    if not SHA.match(commit.sha):
        raise SourceError(f"commit: {commit.sha[:80]!r} is not a full sha", field="commit")
    digest = commit_hash(commit.sha, settings)
    # one maker per commit at a time (a track and a bisect, two replicas): the second waits, then reuses
    # the first's row, and never exports into a folder the first is writing
    session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"commit-env:{digest}"))))
    env = session.scalar(select(Environment).where(Environment.content_hash == digest).with_for_update())
    folder = builds_folder(settings) / digest[:16]
    tree = folder / "tree"
    if env is not None:
        if env.state in ("failed", "pruned"):
            export_tree(source, settings, commit.sha, tree)
            set_state(env, "pending")
            env.error_message, env.job_id = None, None
        env.last_used_at = utcnow()
        return env
    export_tree(source, settings, commit.sha, tree)
    name = environment_name(source, commit.sha)
    if session.scalar(select(Environment.id).where(Environment.name == name)) is not None:
        name = f"{name}-{digest[:6]}"  # the same commit built before under another set of Pythons
    env = Environment(
        name=name, python=str(folder / "venv" / "bin" / "python"), packages={}, state="pending",
        description=f"{source.name} at {commit.sha[:12]}: {commit.subject}"[:2000],
        requirements=[str(tree)], content_hash=digest, folder=str(folder), torch=_service_torch(), freeze=[],
        last_used_at=utcnow(), source=source.name, source_commit=commit.sha, source_commit_date=commit.date,
        source_commit_subject=commit.subject[:500],
    )
    session.add(env)
    session.flush()
    return env


def source_doc(source: Source) -> dict[str, Any]:
    """A source as the API shows it."""
    return {"name": source.name, "kind": source.kind, "location": source.location, "ref": source.ref,
            "created_by": source.created_by, "created_at": source.created_at.isoformat()}
