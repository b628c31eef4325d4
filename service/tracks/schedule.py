"""Tracks: a suite run on a source's latest commit, on demand and on a schedule, bisected when a check breaks.

A track's runs are labelled branch=<track> (so their history is the track's own), track=<track> and
commit=<sha>. The scheduler's steps: `run_due` queues the suite on every due track's latest commit
(one environment per commit, built by the ordinary build path); `bisect_regressions` starts a bisect
over the commits between a regression's last good and first failing run (tracks with auto_bisect) and
writes the first bad commit onto the regression once its bisect has found it, with an alert.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from jobs.verdict_names import PASS, VERDICTS
from models import Bisect, Regression, Run, Source, Track
from models.base import utcnow
from service.bisects.search import create_commit_bisect
from service.core.checks import TRACK_LABEL
from service.core.errors import Conflict, DomainError, InvalidSpec, NotFound
from service.core.settings import Settings
from service.environments import sources
from service.oncall import notification_events as events
from service.runs.admission import Caps
from service.suites.definitions import get_suite
from service.suites.runs import create_suite_run

log = logging.getLogger(__name__)
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
EVERY = re.compile(r"^(\d{1,6})([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_EVERY_S = 60


def parse_every(text: str) -> int:
    """Seconds in '24h', '30m', '7d' (at least a minute)."""
    match = EVERY.match(text.strip())
    seconds = int(match.group(1)) * UNIT_S[match.group(2)] if match else 0
    if seconds < MIN_EVERY_S:
        raise InvalidSpec(f"every: {text[:40]!r} is not a period of at least 1m such as 30m, 24h or 7d",
                          field="every")
    return seconds


def add_track(session: Session, *, name: str, source: str, suite: str, every: str, auto_bisect: bool,
              created_by: str | None) -> Track:
    """Store a track (admin); it is due at once."""
    if not NAME.match(name):
        raise InvalidSpec("name: 1..100 of a-z, 0-9, '.', '_', '-'", field="name")
    src = sources.get_source(session, source)
    get_suite(session, name=suite, version=None)  # 404 now rather than at the first run
    if session.scalar(select(Track.id).where(Track.name == name)) is not None:
        raise Conflict(f"name: track {name!r} already exists", field="name")
    track = Track(name=name, source_id=src.id, suite=suite, every_seconds=parse_every(every),
                  auto_bisect=auto_bisect, next_run_at=utcnow(), created_by=created_by)
    session.add(track)
    session.flush()
    return track


def get_track(session: Session, name: str, *, for_update: bool = False) -> Track:
    """The track called name, or 404."""
    query = select(Track).where(Track.name == name)
    track = session.scalar(query.with_for_update() if for_update else query)
    if track is None:
        raise NotFound(f"track: unknown track {name!r}", field="track")
    return track


def request_run(session: Session, name: str) -> Track:
    """Make the track due now: the scheduler queues its suite on the source's latest commit."""
    track = get_track(session, name, for_update=True)
    track.next_run_at = utcnow()
    return track


def run_track(session: Session, track: Track, *, settings: Settings) -> str | None:
    """Resolve the track's source and queue its suite on that commit's build; returns the suite run id."""
    source = session.get(Source, track.source_id)
    assert source is not None
    now = utcnow()
    track.last_run_at, track.next_run_at = now, now + timedelta(seconds=track.every_seconds)
    try:
        with session.begin_nested():  # a source git cannot read leaves the track as it was, saying why
            commit = sources.resolve(source, settings)
            env = sources.commit_environment(session, source=source, commit=commit, settings=settings)
            suite_run, _ = create_suite_run(
                session, suite_name=track.suite, version=None, environment=env.name,
                labels={"branch": track.name, TRACK_LABEL: track.name, "commit": commit.sha},
                requester=f"track:{track.name}", settings=settings, caps=Caps.gpus_only(settings))
    except DomainError as exc:
        track.last_error = exc.detail[:2000]
        log.warning("track %s: %s", track.name, exc.detail)
        return None
    track.last_commit, track.last_suite_run_id, track.last_error = commit.sha, suite_run.id, None
    log.info("track %s: suite %s queued on %s (%s)", track.name, track.suite, commit.sha[:12], env.name)
    return suite_run.id


def run_due(session: Session, *, settings: Settings) -> int:
    """The scheduler's step: queue the suite of every due track. Returns how many were queued."""
    tracks = session.scalars(
        select(Track).where(Track.next_run_at <= utcnow()).order_by(Track.next_run_at)
        .with_for_update(skip_locked=True)
    ).all()
    return sum(run_track(session, track, settings=settings) is not None for track in tracks)


def commit_of(session: Session, run_id: int | None) -> str | None:
    """The commit a run was labelled with (a track's runs are)."""
    if run_id is None:
        return None
    labels = session.scalar(select(Run.labels).where(Run.id == run_id))
    return (labels or {}).get("commit")


def bisect_check(session: Session, *, track_name: str, check: str, settings: Settings,
                 requester: str | None) -> Bisect:
    """Bisect the commits between the track's last pass of check and its first failure after it."""
    track = get_track(session, track_name)
    source = session.get(Source, track.source_id)
    assert source is not None
    history = list(session.execute(
        select(Run.id, Run.verdict, Run.labels, Run.spec).where(
            Run.check_key == check, Run.track == track.name, Run.verdict.in_(VERDICTS))
        .order_by(Run.finished_at.desc(), Run.id.desc()).limit(500)))
    if not history or history[0].verdict == PASS:
        raise Conflict(f"check: {check} does not fail on track {track.name!r} now", field="check")
    bad = history[0]
    for run in history[1:]:
        if run.verdict == PASS:
            break
        bad = run
    else:
        raise Conflict(f"check: {check} never passed on track {track.name!r}: nothing to bisect from",
                       field="check")
    good_commit, bad_commit = (run.labels or {}).get("commit"), (bad.labels or {}).get("commit")
    if not good_commit or not bad_commit:
        raise Conflict(f"check: the runs of {check} on track {track.name!r} carry no commit label", field="check")
    return create_commit_bisect(
        session, spec=RunSpec.from_dict(dict(bad.spec)), source=source.name, good=good_commit, bad=bad_commit,
        labels={"bisect_track": track.name}, requester=requester, settings=settings)


def bisect_regressions(session: Session, *, settings: Settings) -> int:
    """The scheduler's step: start bisects for new regressions on auto-bisect tracks; name first bad commits."""
    done = 0
    auto = {t.name: t for t in session.scalars(select(Track).where(Track.auto_bisect.is_(True)))}
    if auto:
        open_ = session.scalars(
            select(Regression).where(Regression.track.in_(list(auto)), Regression.state != "resolved",
                                     Regression.bisect_id.is_(None), Regression.compared_track == Regression.track)
            .with_for_update(skip_locked=True)).all()
        for reg in open_:
            try:
                with session.begin_nested():
                    row = bisect_check(session, track_name=reg.track, check=reg.check_key, settings=settings,
                                       requester=f"track:{reg.track}")
            except DomainError as exc:
                log.warning("regression %s: no bisect: %s", reg.id, exc.detail)
                reg.bisect_id = "none"  # not retried every tick; `parity bisect --track` can still start one
                continue
            reg.bisect_id = row.id
            done += 1
    waiting = session.execute(
        select(Regression, Bisect).join(Bisect, Bisect.id == Regression.bisect_id)
        .where(Regression.first_bad_commit.is_(None), Bisect.state == "found")
        .with_for_update(of=Regression, skip_locked=True)).all()
    for reg, row in waiting:
        commit = first_bad_commit(row)
        if commit is None:
            continue
        reg.first_bad_commit, reg.first_bad_subject = commit["sha"], (commit.get("subject") or "")[:500]
        events.regression_event(session, reg, "regression.bisected", None)
        done += 1
    return done


def first_bad_commit(row: Bisect) -> dict[str, Any] | None:
    """The commit a found commit bisect named ({sha, subject, date})."""
    if row.state != "found" or not row.commits:
        return None
    names = list(row.environments)
    index = names.index(row.first_bad) if row.first_bad in names else None
    if index is None:  # the build carries another name: match it by its commit's short sha
        index = next((i for i, c in enumerate(row.commits) if row.first_bad and c["sha"][:12] in row.first_bad),
                     None)
    return row.commits[index] if index is not None else None


def track_doc(session: Session, track: Track) -> dict[str, Any]:
    """A track as the API shows it."""
    source = session.get(Source, track.source_id)
    return {
        "name": track.name, "source": source.name if source else None, "suite": track.suite,
        "every_seconds": track.every_seconds, "auto_bisect": track.auto_bisect,
        "next_run_at": track.next_run_at.isoformat(),
        "last_run_at": track.last_run_at.isoformat() if track.last_run_at else None,
        "last_commit": track.last_commit, "last_suite_run_id": track.last_suite_run_id,
        "last_error": track.last_error, "created_by": track.created_by,
    }


def list_tracks(session: Session) -> list[Track]:
    """Every track, by name."""
    return list(session.scalars(select(Track).order_by(Track.name)))
