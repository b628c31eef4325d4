"""A track's row on the overview: the latest verdict of each check on its latest commits, and the commit
that changed it (the first commit of the current pass or fail streak)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, literal, select
from sqlalchemy.orm import Session

from jobs.verdict_names import GOOD
from models import Environment, Regression, Run, Source, Track

EPOCH = literal("1970-01-01T00:00:00+00:00").cast(Run.finished_at.type)  # no run on the other side yet


def _commit(session: Session, run: Run | None) -> dict[str, Any] | None:
    if run is None:
        return None
    sha = (run.labels or {}).get("commit")
    env = session.get(Environment, run.environment_id)
    subject = env.source_commit_subject if env is not None and env.source_commit == sha else None
    return {"sha": sha, "subject": subject, "run_id": run.id} if sha else None


def _changed_by(session: Session, latest: Run) -> Run:
    """The first run of the streak latest ends: after the last run whose verdict was on the other side."""
    good = latest.verdict in GOOD
    other = select(Run.finished_at).where(
        Run.check_key == latest.check_key, Run.track == latest.track, Run.finished_at.is_not(None),
        Run.finished_at < latest.finished_at,
        (Run.verdict.not_in(GOOD) if good else Run.verdict.in_(GOOD)), Run.verdict.is_not(None),
    ).order_by(Run.finished_at.desc()).limit(1).scalar_subquery()
    first = session.scalar(
        select(Run).where(Run.check_key == latest.check_key, Run.track == latest.track,
                          Run.verdict.is_not(None), Run.finished_at.is_not(None),
                          Run.finished_at > func.coalesce(other, EPOCH)).order_by(Run.finished_at, Run.id).limit(1))
    return first or latest


def track_rows(session: Session) -> list[dict[str, Any]]:
    """One row per track: source, last commit, and per check its latest verdict and the commit that changed it."""
    rows = []
    for track in session.scalars(select(Track).order_by(Track.name)):
        source = session.get(Source, track.source_id)
        latest = session.scalars(
            select(Run).distinct(Run.check_key).where(Run.track == track.name, Run.verdict.is_not(None),
                                                      Run.finished_at.is_not(None))
            .order_by(Run.check_key, Run.finished_at.desc(), Run.id.desc())).all()
        checks = []
        for run in sorted(latest, key=lambda r: r.check_name):
            changed = _commit(session, _changed_by(session, run))
            bisected = session.execute(select(Regression.first_bad_commit, Regression.first_bad_subject).where(
                Regression.check_key == run.check_key, Regression.track == track.name,
                Regression.state != "resolved", Regression.first_bad_commit.is_not(None))).first()
            if bisected is not None and run.verdict not in GOOD:  # the bisect knows better than the track's runs
                changed = {"sha": bisected[0], "subject": bisected[1], "run_id": None, "bisected": True}
            checks.append({
                "check_key": run.check_key, "check_name": run.check_name, "verdict": run.verdict,
                "regression": run.regression, "run_id": run.id, "commit": _commit(session, run),
                "changed_at": changed,
            })
        env = session.scalar(select(Environment).where(Environment.source_commit == track.last_commit).limit(1)) \
            if track.last_commit else None
        rows.append({
            "name": track.name, "source": source.name if source else None, "suite": track.suite,
            "last_commit": track.last_commit, "last_subject": env.source_commit_subject if env else None,
            "last_run_at": track.last_run_at, "last_error": track.last_error, "checks": checks,
        })
    return rows
