"""Regression flagging: compare a finished run's verdict with the history of its check on its track.

History is per (check, track) (service/core/checks.py). A track with no finished run of the check yet is
compared with its base track (`base_branch` label, default main): a PR failing where main passes
"regresses against main". A different check is never compared.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.verdict_label import regression_qualifier
from jobs.verdict_names import COULD_NOT_TELL, FAILED, KNOWN_FAILURE
from models import Regression, Run
from service.core.checks import base_track_of

# verdicts that neither break nor restore a history: an accepted upstream bug, and an error (the check did not
# run to an answer: a rank killed from outside, a timeout, the harness's own crash), which is infrastructure's
# to alert on (notification_events.infra_error_streak), never the build's regression
NEUTRAL = frozenset({KNOWN_FAILURE, *COULD_NOT_TELL})


def _history(run: Run, track: str):  # type: ignore[no-untyped-def]
    return (
        select(Run)
        .where(
            Run.check_key == run.check_key, Run.track == track, Run.id != run.id,
            Run.verdict.is_not(None), Run.verdict.not_in(NEUTRAL), Run.finished_at.is_not(None),
        )
        .order_by(Run.finished_at.desc(), Run.id.desc())
    )


def previous_finished(session: Session, run: Run, track: str | None = None) -> Run | None:
    """The latest run with a (non-neutral) verdict of the same check on track (default: the run's own)."""
    return session.scalar(_history(run, track or run.track).limit(1))


def last_good(session: Session, run: Run, track: str | None = None) -> Run | None:
    """The latest run of the same check on track that did not fail or error."""
    return session.scalar(_history(run, track or run.track).where(Run.verdict.not_in(FAILED)).limit(1))


def compared_track(session: Session, run: Run) -> str | None:
    """Whose history this run is judged against: its own track, else its base track, else none."""
    if previous_finished(session, run) is not None:
        return run.track
    base = base_track_of(run.labels)
    if base != run.track and previous_finished(session, run, base) is not None:
        return base
    return None


def flag(session: Session, run: Run) -> None:
    """Set regression, last_good_run_id, failing_since_run_id and compared_track on a judged run."""
    track = compared_track(session, run)
    run.compared_track = track
    if run.verdict not in FAILED or run.verdict in NEUTRAL:
        run.regression, run.failing_since_run_id = False, None
        return
    if track is None:
        run.regression, run.last_good_run_id, run.failing_since_run_id = False, None, run.id
        return
    good = last_good(session, run, track)
    run.last_good_run_id = good.id if good else None
    previous = previous_finished(session, run, track)
    if previous is not None and previous.verdict in FAILED and track == run.track:
        # still failing: not a new regression; point at the run where the streak began
        run.regression = False
        run.failing_since_run_id = previous.failing_since_run_id or previous.id
    else:
        run.regression = previous is not None and previous.verdict not in FAILED
        run.failing_since_run_id = run.id
    if run.regression and base_failure(session, run) is not None:
        run.regression = False  # the base fails the same check now: not this branch's doing


def base_failure(session: Session, run: Run) -> Run | None:
    """For a failing run on a branch: the base track's latest run of the same check, when it fails too."""
    base = base_track_of(run.labels)
    if run.verdict not in FAILED or base == run.track:
        return None
    latest = previous_finished(session, run, base)
    return latest if latest is not None and latest.verdict in FAILED else None


def fails_on_base_text(session: Session, run: Run) -> str:
    """'fails on main too (since <commit>)' for a branch's failure its base track shares, else ''."""
    latest = base_failure(session, run)
    if latest is None:
        return ""
    # since the first bad commit when a bisect named it, else the commit of the base's first failing run
    commit = session.scalar(select(Regression.first_bad_commit).where(
        Regression.check_key == run.check_key, Regression.track == latest.track, Regression.state != "resolved"))
    if not commit:
        since = session.get(Run, latest.failing_since_run_id) if latest.failing_since_run_id else latest
        commit = ((since or latest).labels or {}).get("commit")
    return f"fails on {latest.track} too" + (f" (since {commit[:12]})" if commit else "")


def regression_text(run: Run) -> str:
    """How a flagged run is described: a regression on its own track, or against its base track."""
    return regression_qualifier(run.track, run.compared_track) if run.regression else ""
