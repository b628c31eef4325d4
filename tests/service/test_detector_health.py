"""Detector health: the periodic self-test batch is queued when due and idle, and judged on the overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.selftest.catalogue import COMBINED
from models import Run
from service.core.settings import get_settings
from service.selftest.batch import detector_health, enqueue_due
from service.web.dashboard.overview import matrix

T0 = datetime(2031, 1, 1, tzinfo=UTC)


def _finish(run: Run, verdict: str, signatures: list[str]) -> None:
    run.state = {"pass": "passed", "fail": "failed", "error": "error"}[verdict]
    run.verdict, run.signatures, run.finished_at = verdict, signatures, T0


def test_batch_is_queued_when_due_and_judged(db_session: Session, monkeypatch) -> None:
    monkeypatch.setenv("PARITY_SELFTEST_INTERVAL_HOURS", "24")
    get_settings.cache_clear()
    settings = get_settings()
    for run in db_session.scalars(select(Run).where(Run.state == "queued")):
        run.state = "cancelled"  # the batch only queues on an idle service
    assert enqueue_due(db_session, settings=settings, now=T0) == 3
    runs = db_session.scalars(select(Run).where(Run.labels["selftest"].astext == "detector-health")).all()
    assert sorted(r.labels["mutant"] for r in runs) == ["benign-reordered-state-dict", "combined", "control"]
    assert enqueue_due(db_session, settings=settings, now=T0 + timedelta(hours=1)) == 0  # busy and not due
    pending = detector_health(db_session)
    assert pending is not None and pending["pending"] == 3 and not pending["healthy"]

    by_name = {r.labels["mutant"]: r for r in runs}
    assert sorted(by_name["combined"].spec["mutants"]) == sorted(COMBINED)
    _finish(by_name["control"], "pass", [])
    _finish(by_name["benign-reordered-state-dict"], "pass", [])
    _finish(by_name["combined"], "fail", ["model-weights-mismatch"])  # most faults went unseen
    db_session.flush()
    health = detector_health(db_session)
    assert health is not None and health["missed"] == 1 and not health["healthy"]
    combined = next(r for r in health["rows"] if r["mutant"] == "combined")
    assert "rng-state-mismatch" in combined["expect"] and combined["outcome"] == "missed"

    _finish(by_name["benign-reordered-state-dict"], "fail", ["model-weights-mismatch"])
    expected = next(r for r in health["rows"] if r["mutant"] == "combined")["expect"]
    _finish(by_name["combined"], "fail", expected)
    db_session.flush()
    health = detector_health(db_session)
    assert health is not None and health["caught"] == 1 and health["false_alarms"] == 1
    _finish(by_name["benign-reordered-state-dict"], "pass", [])
    db_session.flush()
    m = matrix(db_session)
    assert m.health is not None and m.health["healthy"] and m.health["caught"] == 1
    # the batch's failing runs fail on purpose: never cells of the matrix nor "failing now"
    cells = [c for row in m.rows for c in row.cells.values()] + list(m.failing)
    assert not {c.run_id for c in cells} & {r.id for r in runs}
    # due again a day later once idle
    assert enqueue_due(db_session, settings=settings, now=T0 + timedelta(hours=25)) == 3
    get_settings.cache_clear()


def test_interval_zero_turns_it_off(db_session: Session) -> None:
    assert get_settings().selftest_interval_hours == 0  # tests run with it off (conftest)
    assert enqueue_due(db_session, settings=get_settings(), now=T0) == 0
