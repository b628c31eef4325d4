"""Regressions as objects: open on a check's first failure after a pass on a track, gather later
failures, acknowledge, and resolve on the next pass. Each change of state goes through
regression_state.move (recorded as a RegressionEvent) and writes its notification to the outbox in
the caller's transaction (never commits)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.verdict_names import FAILED
from models import Regression, Run
from service.core.errors import Forbidden, InvalidSpec, NotFound
from service.core.tracks import Grant, may_write
from service.oncall import notification_events as events
from service.oncall import regression_state
from service.oncall.flagging import NEUTRAL
from service.oncall.regression_state import RegressionState

STATES = tuple(s.value for s in RegressionState)
UNRESOLVED = tuple(s.value for s in RegressionState if s in regression_state.UNRESOLVED)


def unresolved(session: Session, check_key: str, track: str) -> Regression | None:
    """The open or acknowledged regression of a check on a track (row-locked), if any."""
    return session.scalar(
        select(Regression)
        .where(Regression.check_key == check_key, Regression.track == track, Regression.state.in_(UNRESOLVED))
        .with_for_update()
    )


def on_verdict(session: Session, run: Run) -> Regression | None:
    """Open, extend or resolve the regression of run's check on run's track; -> the regression touched."""
    if run.verdict is None or run.verdict in NEUTRAL:
        return None
    current = unresolved(session, run.check_key, run.track)
    if run.verdict in FAILED:
        if current is not None:
            # one regression, one message: a later failure joins it silently
            current.failing_run_ids = [*current.failing_run_ids, run.id]
            current.latest_failing_run_id = run.id
            return current
        if not run.regression:
            return None
        # two evaluators opening the same check × track at once: the partial unique index makes the
        # second transaction fail and roll back whole; its run is evaluated again next tick and joins
        opened = Regression(
            check_key=run.check_key, check_name=run.check_name, config=run.config, track=run.track,
            compared_track=run.compared_track or run.track, first_failing_run_id=run.id,
            last_good_run_id=run.last_good_run_id, latest_failing_run_id=run.id, failing_run_ids=[run.id],
            signatures=list(run.signatures or []),
        )
        regression_state.opened(session, opened, f"run {run.id} failed where the check last passed")
        if not (run.labels or {}).get("suite_run"):  # a suite's checks alert once, as the suite run (suite_alerts)
            events.regression_event(session, opened, "regression.opened", run)
        return opened
    if current is not None:
        regression_state.move(session, current, RegressionState.RESOLVED, f"run {run.id} passed")
        current.fixed_by_run_id = run.id
        session.flush()
        events.regression_event(session, current, "regression.resolved", run)
    return current


def acknowledge(
    session: Session, regression_id: int, *, grant: Grant, note: str = "", upstream_url: str | None = None
) -> Regression:
    """Record who owns a regression (the grant's name; and why, and the upstream issue); notifies once.

    A regression is its track's state, as a verdict there is: only a token that may write the track (the
    check every route that queues runs makes: service/core/tracks.py) may acknowledge or annotate it.
    """
    reg = session.scalar(select(Regression).where(Regression.id == regression_id).with_for_update())
    if reg is None:
        raise NotFound(f"regression {regression_id} does not exist", field="regression_id")
    if not may_write(grant, reg.track):
        allowed = ", ".join(repr(p) for p in grant.tracks) or "none"
        raise Forbidden(f"track: token {grant.name!r} may not acknowledge regression {regression_id} on track "
                        f"{reg.track!r}; its tracks: {allowed}", field="track")
    who = grant.name
    if upstream_url and not upstream_url.startswith(("http://", "https://")):
        raise InvalidSpec(f"upstream_url: expected an http(s) URL, got {upstream_url!r}", field="upstream_url")
    first = reg.state == RegressionState.OPEN
    regression_state.move(session, reg, RegressionState.ACKNOWLEDGED, f"acknowledged by {who[:200]}")
    reg.acknowledged_by = who[:200]
    reg.note, reg.upstream_url = note or reg.note, upstream_url or reg.upstream_url
    session.flush()
    if first:
        latest = session.get(Run, reg.latest_failing_run_id)
        events.regression_event(session, reg, "regression.acknowledged", latest)
    return reg


def list_regressions(session: Session, *, state: str | None = None, check: str | None = None,
                     track: str | None = None, limit: int = 100) -> list[Regression]:
    """Regressions, newest first, filtered by state (open/acknowledged/resolved/unresolved), check, track."""
    query = select(Regression)
    if state == "unresolved":
        query = query.where(Regression.state.in_(UNRESOLVED))
    elif state:
        if state not in STATES:
            raise InvalidSpec(f"state: unknown {state!r}; allowed: {', '.join((*STATES, 'unresolved'))}",
                              field="state")
        query = query.where(Regression.state == state)
    if check:
        query = query.where(Regression.check_key == check)
    if track:
        query = query.where(Regression.track == track)
    return list(session.scalars(query.order_by(Regression.id.desc()).limit(limit)))


def get_regression(session: Session, regression_id: int) -> Regression:
    """One regression or 404."""
    reg = session.get(Regression, regression_id)
    if reg is None:
        raise NotFound(f"regression {regression_id} does not exist", field="regression_id")
    return reg
