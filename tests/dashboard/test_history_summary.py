"""The overview reads history_summary (kept by a trigger on runs): it must say what the runs say.

The reference is the overview's former query, in Python: per check × track the latest run with a
verdict (finished_at, nulls last, then id) and how many runs gave each verdict, self-tests left
out. Every kind of write the trigger has to follow is made, and the summary compared after each.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from jobs.verdict_names import RUN_VERDICTS as VERDICTS
from models import Environment, HistorySummary, Run
from service.web.dashboard.overview import latest_cells

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _reference(session: Session) -> dict[tuple[str, str], tuple[int, dict[str, int]]]:
    runs = [r for r in session.scalars(select(Run).where(Run.verdict.is_not(None))) if "selftest" not in r.labels]
    out: dict[tuple[str, str], tuple[int, dict[str, int]]] = {}
    for key in {(r.check_key, r.track) for r in runs}:
        mine = [r for r in runs if (r.check_key, r.track) == key]
        latest = max(mine, key=lambda r: (r.finished_at is not None, r.finished_at or T0, r.id))
        out[key] = (latest.id, {v: sum(r.verdict == v for r in mine) for v in VERDICTS})
    return out


def _summary(session: Session) -> dict[tuple[str, str], tuple[int, dict[str, int]]]:
    session.flush()
    return {(c.check_key, c.track): (c.run_id, c.counts) for c in latest_cells(session)}


def _run(session: Session, env: Environment, config: str, verdict: str | None, minutes: int | None,
         **labels: str) -> Run:
    run = Run(config=config, spec={"config": config, "dp": 2, "steps": 20, "save_step": 10}, environment=env,
              labels=labels, state="passed" if verdict else "queued", verdict=verdict, signatures=[], summary={},
              finished_at=None if minutes is None else T0 + timedelta(minutes=minutes))
    session.add(run)
    session.flush()
    return run


def test_summary_follows_every_write_to_runs(db_session: Session) -> None:
    env = Environment(name="summary-env", python="/usr/bin/python3", description="", packages={})
    db_session.add(env)
    db_session.flush()
    s = db_session
    a1 = _run(s, env, "moe-fp32-router", "pass", 1, branch="main")
    a2 = _run(s, env, "moe-fp32-router", "fail", 2, branch="main")
    _run(s, env, "moe-fp32-router", "pass", 3, branch="release")
    b1 = _run(s, env, "dense-bf16", "pass", None, branch="main")  # a verdict without a finish time
    _run(s, env, "dense-bf16", "pass", 0, branch="main")
    queued = _run(s, env, "dense-bf16", None, None, branch="main")
    _run(s, env, "moe-fp32-router", "fail", 9, branch="main", selftest="1")  # never counted
    assert _summary(s) == _reference(s)
    assert _summary(s)[(a2.check_key, "main")][0] == a2.id

    # a queued run finishes: it becomes the latest
    s.execute(update(Run).where(Run.id == queued.id).values(verdict="error", state="error",
                                                             finished_at=T0 + timedelta(minutes=5)))
    s.expire_all()
    assert _summary(s) == _reference(s)
    # the latest run's verdict is rewritten (known failure): counts move, it stays the latest
    s.execute(update(Run).where(Run.id == a2.id).values(verdict="known-failure"))
    s.expire_all()
    assert _summary(s) == _reference(s)
    # a finish time moves back: the latest is found again among the others
    s.execute(update(Run).where(Run.id == a2.id).values(finished_at=T0))
    s.expire_all()
    assert _summary(s) == _reference(s)
    assert _summary(s)[(a1.check_key, "main")][0] == a1.id
    # a run is marked a self-test after the fact, then a run is deleted
    s.execute(update(Run).where(Run.id == a1.id).values(labels={"branch": "main", "selftest": "1"}))
    s.execute(delete(Run).where(Run.id == b1.id))
    s.expire_all()
    assert _summary(s) == _reference(s)
    # nothing left of a verdict: its summary row goes
    s.execute(delete(Run).where(Run.config == "dense-bf16"))
    s.expire_all()
    assert _summary(s) == _reference(s)
    assert s.scalar(select(HistorySummary).where(HistorySummary.check_key == b1.check_key)) is None
