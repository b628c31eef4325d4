"""Bisect: the first environment of an ordered list on which a check fails, running as few checks as possible.

The environments are ordered oldest first: the first is taken as good and the last as bad (as git
bisect takes its endpoints). Each step tests the middle of the remaining range. A step's verdict
is the latest stored terminal verdict of the same check (check key) on that environment, whoever
ran it, so verdicts already stored are reused; only when none exists is a run queued, labelled
`bisect=<id>`. `advance()` recomputes everything from the runs and creates at most the next run,
under a row lock, so calling it again (API GET, CLI loop, scheduler) never queues a step twice.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from jobs.verdict_names import BROKEN, PASS
from models import Bisect, Environment, Run
from models.base import utcnow
from service.core.checks import check_key, check_name
from service.core.errors import DomainError, InvalidSpec, NotFound
from service.core.links import bisect_urls, run_url
from service.core.settings import Settings
from service.core.verdicts import run_label
from service.environments import sources
from service.environments.registry import (
    DEFAULT_ENVIRONMENT,
    ensure_default_environment,
    get_environment,
    use_environment,
)
from service.runs.admission import Caps
from service.runs.records import create_run

BISECT_LABEL = "bisect"
MAX_ENVIRONMENTS = 64
GOOD_VERDICTS = frozenset({PASS})
BAD_VERDICTS = frozenset(BROKEN)


def _environments(session: Session, names: list[str], settings: Settings) -> list[Environment]:
    if len(names) < 2:
        raise InvalidSpec("environments: a bisect needs a good and a bad environment", field="good")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidSpec(f"environments: {dup!r} is listed twice", field="between")
    if len(names) > MAX_ENVIRONMENTS:
        raise InvalidSpec(f"environments: at most {MAX_ENVIRONMENTS}, got {len(names)}", field="between")
    return [
        ensure_default_environment(session, settings=settings) if n == DEFAULT_ENVIRONMENT
        else get_environment(session, name=n)
        for n in names
    ]


def spec_of_check(session: Session, key: str) -> dict[str, Any]:
    """The spec of a stored check (its latest run), or 404."""
    spec = session.scalar(select(Run.spec).where(Run.check_key == key).order_by(Run.id.desc()).limit(1))
    if spec is None:
        raise NotFound(f"check: no run of check {key!r} is stored", field="check")
    return dict(spec)


def create_bisect(
    session: Session, *, spec: RunSpec, environments: list[str], labels: dict[str, str],
    requester: str | None, settings: Settings, caps: Caps | None = None,
) -> Bisect:
    """Store the bisect and take its first step (which may queue a run)."""
    _environments(session, environments, settings)
    data = spec.to_dict()
    row = Bisect(
        id=uuid.uuid4().hex[:12], spec=data, check_key=check_key(data), check_name=check_name(data)[:500],
        environments=list(environments), labels=dict(labels), requester=requester,
    )
    session.add(row)
    session.flush()
    advance(session, row.id, settings=settings, caps=caps)
    return row


def create_commit_bisect(
    session: Session, *, spec: RunSpec, source: str, good: str, bad: str, labels: dict[str, str],
    requester: str | None, settings: Settings, caps: Caps | None = None,
) -> Bisect:
    """A bisect over a source's commits from good (passing) to bad (failing): each commit is built only
    when a step needs it (one environment per commit, reused), then its first step is taken."""
    src = sources.get_source(session, source)
    commits = [sources.resolve(src, settings, good), *sources.commits_between(src, settings, good, bad)]
    data = spec.to_dict()
    row = Bisect(
        id=uuid.uuid4().hex[:12], spec=data, check_key=check_key(data), check_name=check_name(data)[:500],
        environments=[sources.environment_name(src, c.sha) for c in commits], labels=dict(labels),
        requester=requester, source=src.name, commits=[c.to_dict() for c in commits],
    )
    session.add(row)
    session.flush()
    advance(session, row.id, settings=settings, caps=caps)
    return row


def _commit_environments(session: Session, row: Bisect, settings: Settings) -> list[Environment | None]:
    """A commit bisect's environments as built so far (None: that commit has no build yet)."""
    return [sources.find_commit_environment(session, c["sha"], settings) for c in row.commits or []]


def _build_commit(session: Session, row: Bisect, index: int, settings: Settings) -> Environment:
    commit = (row.commits or [])[index]
    date = commit.get("date")
    return sources.commit_environment(
        session, source=sources.get_source(session, row.source or ""), settings=settings,
        commit=sources.Commit(sha=commit["sha"], subject=commit.get("subject") or "",
                              date=datetime.fromisoformat(date) if date else None))


def _stored_verdict(session: Session, key: str, env_id: int) -> Run | None:
    return session.scalar(
        select(Run).where(Run.check_key == key, Run.environment_id == env_id,
                          Run.verdict.in_(GOOD_VERDICTS | BAD_VERDICTS))
        .order_by(Run.finished_at.desc().nulls_last(), Run.id.desc()).limit(1)
    )


def _own_run(session: Session, row: Bisect, env_id: int) -> Run | None:
    return session.scalar(
        select(Run).where(Run.labels.contains({BISECT_LABEL: row.id}), Run.environment_id == env_id)
        .order_by(Run.id.desc()).limit(1)
    )


def _in_flight(session: Session, key: str, env_id: int) -> Run | None:
    return session.scalar(
        select(Run).where(Run.check_key == key, Run.environment_id == env_id, Run.finished_at.is_(None))
        .order_by(Run.id).limit(1)
    )


def get_bisect(session: Session, bisect_id: str) -> Bisect:
    """The bisect as stored (no lock, no write: a GET only reads), or 404."""
    row = session.get(Bisect, bisect_id)
    if row is None:
        raise NotFound(f"bisect: unknown bisect {bisect_id!r}", field="bisect")
    return row


def advance(session: Session, bisect_id: str, *, settings: Settings, caps: Caps | None = None) -> Bisect:
    """Walk the bisect as far as the stored verdicts allow; queue the next run if one is needed."""
    row = session.scalar(select(Bisect).where(Bisect.id == bisect_id).with_for_update())
    if row is None:
        raise NotFound(f"bisect: unknown bisect {bisect_id!r}", field="bisect")
    if row.state != "running":
        return row
    envs: list[Environment | None] = (
        _commit_environments(session, row, settings) if row.commits is not None
        else list(_environments(session, list(row.environments), settings)))
    lo, hi = 0, len(envs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        env = envs[mid]
        if env is None:  # a commit not built yet: build it now, and run the check on it once it is
            try:
                env = envs[mid] = _build_commit(session, row, mid, settings)
            except DomainError as exc:
                row.state, row.finished_at = "error", utcnow()
                row.error_message = f"building {row.environments[mid]}: {exc.detail}"[:2000]
                break
        done = _stored_verdict(session, row.check_key, env.id)
        if done is not None:
            lo, hi = (mid, hi) if done.verdict in GOOD_VERDICTS else (lo, mid)
            continue
        own = _own_run(session, row, env.id)
        if own is not None and own.finished_at is not None:  # our run ended without pass/fail
            row.state, row.finished_at = "error", utcnow()
            row.error_message = (f"run {own.id} on {env.name} ended {own.state} without a verdict: "
                                 f"{(own.error_message or '')[:500]}")
            break
        if env.state == "failed":  # the commit does not build: the bisect cannot say which side it is on
            row.state, row.finished_at = "error", utcnow()
            row.error_message = f"{env.name} failed to build: {(env.error_message or '')[-500:]}"
            break
        if own is None and _in_flight(session, row.check_key, env.id) is None:
            spec = RunSpec.from_dict(dict(row.spec))
            create_run(session, spec=spec, environment=use_environment(env), requester=row.requester,
                       labels={**row.labels, BISECT_LABEL: row.id}, caps=caps)
        break
    else:
        first_bad = envs[hi]
        row.state, row.finished_at = "found", utcnow()
        row.first_bad = first_bad.name if first_bad is not None else row.environments[hi]
    row.updated_at = utcnow()
    session.flush()
    return row


def _cell(run: Run | None, base: str, reused: bool) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"run_id": run.id, "state": run.state, "verdict": run.verdict, "label": run_label(run),
            "signatures": list(run.signatures or []), "reused": reused, "link": run_url(base, run.id)}


def describe(session: Session, row: Bisect, base: str) -> dict[str, Any]:
    """The bisect as plain data: every environment with the run that decided it, the answer, links."""
    names = list(row.environments)
    by_name = {e.name: e for e in session.scalars(select(Environment).where(Environment.name.in_(names)))}
    commits = list(row.commits or [])
    if commits:  # a commit's build may carry another name (built before under other Pythons)
        shas = [c["sha"] for c in commits]
        built = {e.source_commit: e for e in session.scalars(
            select(Environment).where(Environment.source_commit.in_(shas), Environment.source.is_not(None)))}
        by_name.update({n: built[c["sha"]] for n, c in zip(names, commits, strict=True) if c["sha"] in built})
    own = list(session.scalars(select(Run).where(Run.labels.contains({BISECT_LABEL: row.id})).order_by(Run.id)))
    rows: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        env = by_name.get(name)
        mine = next((r for r in reversed(own) if env is not None and r.environment_id == env.id), None)
        stored = _stored_verdict(session, row.check_key, env.id) if env is not None else None
        decided = stored or mine
        rows.append({
            "index": i, "environment": name, "megatron_core": env.megatron_core if env else None,
            "role": "good" if i == 0 else "bad" if i == len(names) - 1 else "between",
            "run": _cell(decided, base, reused=decided is not None and decided not in own),
            "first_bad": name == row.first_bad or (env is not None and env.name == row.first_bad),
            "tested": False, **({"commit": commits[i]} if commits else {}),
        })
    # the path the bisect took: which middles were tested (by a stored verdict or a run of its own)
    lo, hi = 0, len(rows) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        rows[mid]["tested"] = True
        run = rows[mid]["run"]
        if run is None or run["verdict"] not in GOOD_VERDICTS | BAD_VERDICTS:
            break
        lo, hi = (mid, hi) if run["verdict"] in GOOD_VERDICTS else (lo, mid)
    first_bad = next((r for r in rows if r["first_bad"]), None)
    last_good = rows[first_bad["index"] - 1] if first_bad else None
    return {
        "id": row.id, "state": row.state, "check_key": row.check_key, "check_name": row.check_name,
        "spec": dict(row.spec), "labels": dict(row.labels or {}), "first_bad": row.first_bad,
        "last_good": last_good["environment"] if last_good else None, "error_message": row.error_message,
        "runs_created": len(own), "source": row.source,
        "first_bad_commit": first_bad.get("commit") if first_bad else None,
        "last_good_commit": last_good.get("commit") if last_good else None,
        "runs_reused": sum(1 for r in rows if r["tested"] and r["run"] is not None and r["run"]["reused"]),
        "environments": rows, "created_at": row.created_at.isoformat(),
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
        "links": {**bisect_urls(base, row.id),
                  "first_bad_run": (first_bad["run"] or {}).get("link") if first_bad else None,
                  "last_good_run": (last_good["run"] or {}).get("link") if last_good else None},
    }


def advance_open(session: Session, *, settings: Settings) -> int:
    """The scheduler's step: advance every running bisect (its verdicts may have just been stored).

    Returns how many moved (ended, or queued a run): a bisect waiting on a build or a run is not
    progress, or the scheduler's loop, which ticks again at once after progress, would spin on it."""
    ids = list(session.scalars(select(Bisect.id).where(Bisect.state == "running").order_by(Bisect.created_at)))
    moved = 0
    for bisect_id in ids:
        before = _run_count(session, bisect_id)
        row = advance(session, bisect_id, settings=settings)
        moved += row.state != "running" or _run_count(session, bisect_id) != before
    return moved


def _run_count(session: Session, bisect_id: str) -> int:
    return session.scalar(select(func.count()).select_from(Run).where(
        Run.labels.contains({BISECT_LABEL: bisect_id}))) or 0
