"""Detector health: the periodic self-test batch is queued when due and idle, and judged on the overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.selftest.catalogue import COMBINED, MUTANTS, combined_mutant, expectation, health_specs
from models import Run
from service.core.settings import get_settings
from service.selftest.batch import detector_health, enqueue_due
from service.web.dashboard.overview import matrix

T0 = datetime(2031, 1, 1, tzinfo=UTC)


def _finish(run: Run, verdict: str, signatures: list[str]) -> None:
    run.state = {"pass": "passed", "fail": "failed", "error": "error"}[verdict]
    run.verdict, run.signatures, run.finished_at = verdict, signatures, T0


def _finish_as_expected(runs: list[Run]) -> None:
    """Every run ends as the catalogue expects it to: controls and benign changes pass, faults are caught."""
    for run in runs:
        mutant = expectation(run.spec.get("mutants") or [])
        if mutant is None or mutant.benign:
            _finish(run, "pass", [])
        else:
            _finish(run, mutant.verdict, list(mutant.expect))


def test_batch_is_queued_when_due_and_judged(db_session: Session, monkeypatch) -> None:
    monkeypatch.setenv("PARITY_SELFTEST_INTERVAL_HOURS", "24")
    get_settings.cache_clear()
    settings = get_settings()
    for run in db_session.scalars(select(Run).where(Run.state == "queued")):
        run.state = "cancelled"  # the batch only queues on an idle service
    batch = health_specs()
    assert enqueue_due(db_session, settings=settings, now=T0) == len(batch)
    runs = list(db_session.scalars(select(Run).where(Run.labels["selftest"].astext == "detector-health")).all())
    names = sorted(r.labels["mutant"] for r in runs)
    assert names == sorted(name for name, _ in batch)
    # the nightly batch is the whole catalogue, one mutant per run, plus the combined smoke test
    assert {n.split("@")[0] for n in names} >= set(MUTANTS) | {"control", "combined"}
    assert enqueue_due(db_session, settings=settings, now=T0 + timedelta(hours=1)) == 0  # busy and not due
    pending = detector_health(db_session)
    assert pending is not None and pending["pending"] == len(batch) and not pending["healthy"]

    by_name = {r.labels["mutant"]: r for r in runs}
    assert sorted(by_name["combined"].spec["mutants"]) == sorted(COMBINED)
    _finish_as_expected(runs)
    _finish(by_name["combined"], "fail", ["model-weights-mismatch"])  # most faults went unseen
    db_session.flush()
    health = detector_health(db_session)
    assert health is not None and health["missed"] == 1 and not health["healthy"]
    combined = next(r for r in health["rows"] if r["mutant"] == "combined")
    assert "rng-state-mismatch" in combined["expect"] and combined["outcome"] == "missed"

    benign = "benign-state-in-new-storage@dense-bf16"
    _finish(by_name[benign], "fail", ["model-weights-mismatch"])
    _finish(by_name["combined"], "fail", list(combined_mutant().expect))
    db_session.flush()
    health = detector_health(db_session)
    caught = len([r for r in runs if r.verdict != "pass"]) - 1  # every fault, less the benign false alarm
    assert health is not None and health["caught"] == caught and health["false_alarms"] == 1
    _finish(by_name[benign], "pass", [])
    db_session.flush()
    m = matrix(db_session)
    assert m.health is not None and m.health["healthy"] and m.health["caught"] == caught
    # the batch's failing runs fail on purpose: never cells of the matrix nor "failing now"
    cells = [c for row in m.rows for c in row.cells.values()] + list(m.failing)
    assert not {c.run_id for c in cells} & {r.id for r in runs}
    # due again a day later once idle
    assert enqueue_due(db_session, settings=settings, now=T0 + timedelta(hours=25)) == len(batch)
    get_settings.cache_clear()


def test_interval_zero_turns_it_off(db_session: Session) -> None:
    assert get_settings().selftest_interval_hours == 0  # tests run with it off (conftest)
    assert enqueue_due(db_session, settings=get_settings(), now=T0) == 0
