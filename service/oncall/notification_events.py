"""Events -> outbox rows, in the caller's transaction: a committed event always has its messages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from jobs.verdict_label import verdict_label
from jobs.verdict_names import COULD_NOT_TELL
from models import Environment, NotificationChannel, OutboxMessage, Regression, Run
from models.base import utcnow
from service.core.links import public_base, regression_url, run_url
from service.core.run_state import TERMINAL, RunState
from service.core.settings import get_settings
from service.core.verdicts import reading

EVENTS = ("regression.opened", "regression.acknowledged", "regression.resolved", "run.infra-errors", "suite-run.failed",
          "regression.bisected")
# a suite run's failure replaces the per-check regression.opened messages of its checks: who wants those gets it
ALSO_WANTED_BY = {"suite-run.failed": "regression.opened"}
TITLES = {
    "suite-run.failed": "Suite run failed",
    "regression.opened": "Regression",
    "regression.acknowledged": "Acknowledged",
    "regression.resolved": "Resolved",
    "run.infra-errors": "Infrastructure errors",
    "regression.bisected": "First bad commit",
}


def enqueue(session: Session, event: str, dedup_key: str, payload: dict[str, Any]) -> int:
    """Write one outbox row per enabled channel that wants event; a repeated dedup_key adds nothing."""
    channels = session.scalars(select(NotificationChannel).where(NotificationChannel.enabled.is_(True))).all()
    wanted = [c for c in channels if not c.events or event in c.events or ALSO_WANTED_BY.get(event) in c.events]
    if not wanted:
        return 0
    now = utcnow()
    rows = [{"channel_id": c.id, "event": event, "dedup_key": dedup_key, "payload": payload, "state": "pending",
             "attempts": 0, "next_attempt_at": now, "created_at": now} for c in wanted]
    stmt = (insert(OutboxMessage).values(rows)
            .on_conflict_do_nothing(constraint="uq_notification_outbox_channel_dedup").returning(OutboxMessage.id))
    return len(session.execute(stmt).all())


def run_facts(session: Session, run: Run | None) -> dict[str, Any]:
    """What a reader of a notification needs without opening it: environment, commit, and the run's reading
    (label with qualifiers, cause sentences with slugs, first divergent step, bound)."""
    if run is None:
        return {}
    env = session.get(Environment, run.environment_id)
    read = reading(run)
    return {
        "environment": env.name if env else None,
        "megatron_core": (run.summary or {}).get("packages", {}).get("megatron_core") or (env.megatron_core if env
                                                                                          else None),
        "commit": (run.labels or {}).get("commit"),
        # the job's own label, as before, for receivers that match on it; verdict_label is what people read
        "verdict": verdict_label(run.verdict, (run.summary or {}).get("worked_around_by")
                                 or (run.summary or {}).get("worked_around")),
        "verdict_label": read.label,
        "first_divergent_step": run.first_divergent_step,
        "cause": read.cause or None,
        "reading": read.to_dict(),
    }


def summary_line(event: str, reg: Regression, facts: dict[str, Any]) -> str:
    """One line saying what happened: check, track, environment, commit, verdict, cause, first divergent step."""
    where = f"{reg.check_name} on {reg.track}"
    if facts.get("environment"):
        where += f" (environment {facts['environment']}" + (f", commit {facts['commit']}" if facts.get("commit")
                                                             else "") + ")"
    if event == "regression.bisected" and reg.first_bad_commit:
        return f"First bad commit {reg.first_bad_commit[:12]} \"{reg.first_bad_subject or ''}\": {where}"
    if event != "regression.opened":
        return f"{TITLES[event]}: {where}"
    read = facts.get("reading") or {}
    line = read.get("line") or facts.get("verdict_label") or facts.get("verdict") or "fail"
    against = f" against {reg.compared_track}" if reg.compared_track and reg.compared_track != reg.track else ""
    return f"Regression{against}: {where} — {line}"


def regression_event(session: Session, reg: Regression, event: str, run: Run | None) -> None:
    """Enqueue one message about a regression, with its triage link and a one-line summary."""
    base = public_base(get_settings())
    trigger = run.id if run is not None else reg.latest_failing_run_id
    facts = run_facts(session, run if run is not None else session.get(Run, trigger) if trigger else None)
    payload = {
        "event": event,
        "title": f"{TITLES[event]}: {reg.check_name} on {reg.track}",
        "summary": summary_line(event, reg, facts),
        **facts,
        "regression": {
            "id": reg.id, "state": reg.state, "check_key": reg.check_key, "check": reg.check_name,
            "config": reg.config, "track": reg.track, "compared_track": reg.compared_track,
            "signatures": reg.signatures, "first_failing_run_id": reg.first_failing_run_id,
            "last_good_run_id": reg.last_good_run_id, "fixed_by_run_id": reg.fixed_by_run_id,
            "acknowledged_by": reg.acknowledged_by, "note": reg.note, "upstream_url": reg.upstream_url,
            "url": regression_url(base, reg.id), "bisect_id": reg.bisect_id,
            "first_bad_commit": reg.first_bad_commit, "first_bad_subject": reg.first_bad_subject,
        },
        "run_id": trigger,
        "triage_url": run_url(base, reg.first_failing_run_id, "triage"),
        "run_url": run_url(base, trigger),
    }
    enqueue(session, event, f"regression-{reg.id}-{event}", payload)


def infra_error_streak(session: Session, run: Run, threshold: int) -> bool:
    """After run ended in an infrastructure error: notify once when its check × track has just had
    more than threshold in a row (the run that crosses the threshold; later ones stay quiet)."""
    recent = session.execute(
        select(Run.id, Run.state, Run.verdict).where(
            Run.check_key == run.check_key, Run.track == run.track, Run.finished_at.is_not(None),
            Run.state.in_(sorted(s.value for s in TERMINAL if s is not RunState.CANCELLED)),  # it ran to an end
        ).order_by(Run.finished_at.desc(), Run.id.desc()).limit(threshold + 2)
    ).all()
    # an infrastructure error ends a run in state error without a verdict (no parity result at all), or with the
    # evaluator's "couldn't tell" (the job ran but no answer came: a rank killed, a timeout, the harness's crash)
    infra = [r.state == "error" and (r.verdict is None or r.verdict in COULD_NOT_TELL) for r in recent]
    crossing = len(infra) >= threshold + 1 and all(infra[: threshold + 1]) and not all(infra[threshold + 1:] or [False])
    if not crossing:
        return False
    base = public_base(get_settings())
    streak = sorted(r.id for r in recent[: threshold + 1])
    payload = {
        "event": "run.infra-errors",
        "title": f"{TITLES['run.infra-errors']}: {run.check_name} on {run.track}, {len(streak)} in a row",
        "run_id": run.id, "runs": streak, "check_key": run.check_key, "track": run.track,
        "error": run.error_message, "triage_url": run_url(base, run.id, "triage"), "run_url": run_url(base, run.id),
    }
    enqueue(session, "run.infra-errors", f"infra-{run.id}", payload)
    return True


def on_run_ended(session: Session, run: Run) -> bool:
    """A run's final-state handler (service/runs/lifecycle.py): a run that ended in an infrastructure error, without
    a verdict or with "couldn't tell", counts toward its check's streak, whichever path ended it."""
    if run.state != RunState.ERROR.value or not (run.verdict is None or run.verdict in COULD_NOT_TELL):
        return False
    return infra_error_streak(session, run, get_settings().notify_infra_errors_after)


def backoff(attempts: int, base_s: float = 2.0, cap_s: float = 600.0) -> timedelta:
    """Delay before the next delivery attempt: exponential, capped."""
    return timedelta(seconds=min(cap_s, base_s * 2 ** max(0, attempts - 1)))
