"""An infrastructure error streak on one check × track notifies once, when it crosses the threshold, whichever
path ended each run (the scheduler's give-up, or a verdict of "couldn't tell"); such a run is infrastructure's: it
opens no regression, resolves none, and breaks no check's history."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import NotificationChannel, OutboxMessage, Phase, Run
from service.core.run_state import RunState
from service.core.settings import Settings
from service.runs.lifecycle import transition
from service.scheduler.submitter import retry_or_give_up
from tests.plugins.verdict_helpers import finish

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}


@pytest.fixture
def receiver_channel(db_session: Session) -> NotificationChannel:
    """A channel for every event (delivery is tested elsewhere; here only what lands in the outbox)."""
    channel = NotificationChannel(name="ops", kind="slack", url="http://127.0.0.1:9/hook", events=[], enabled=True)
    db_session.add(channel)
    db_session.flush()
    return channel


def _infra_error(client: TestClient, db: Session, headers: dict[str, str], settings: Settings) -> int:
    body = {"spec": SPEC, "labels": {"branch": "main"}}
    run_id = client.post("/api/v1/runs", json=body, headers=headers).json()["id"]
    run = db.get(Run, run_id)
    assert run is not None
    transition(db, run, RunState.TRAIN_SUBMITTED, "test")
    # the scheduler's own give-up path after the last retry of a phase killed from outside
    last = Phase(run_id=run.id, name="train_and_save", attempt=settings.max_infra_retries + 1, executor="slurm")
    retry_or_give_up(db, phase=last, run=run, what="slurm state NODE_FAIL", settings=settings, executor="slurm")
    db.commit()  # as the scheduler's step does: the final state's handlers (the streak) run at the commit
    return run_id


def _messages(db: Session) -> list[OutboxMessage]:
    return list(db.scalars(select(OutboxMessage).where(OutboxMessage.event == "run.infra-errors")
                           .order_by(OutboxMessage.id)))


@pytest.fixture
def streak_of_two(monkeypatch: pytest.MonkeyPatch, settings_env: None) -> Settings:
    from service.core.settings import get_settings

    monkeypatch.setenv("PARITY_NOTIFY_INFRA_ERRORS_AFTER", "2")
    get_settings.cache_clear()
    return Settings(notify_infra_errors_after=2, max_infra_retries=1)


def test_streak_notifies_once_per_streak(
    client: TestClient, db_session: Session, make_token, receiver_channel: NotificationChannel,
    streak_of_two: Settings,
) -> None:
    settings = streak_of_two
    submit = make_token("submit")
    ids = [_infra_error(client, db_session, submit, settings) for _ in range(2)]
    assert _messages(db_session) == []  # two in a row is not more than two
    ids.append(_infra_error(client, db_session, submit, settings))
    (message,) = _messages(db_session)
    assert message.payload["runs"] == ids and message.payload["triage_url"].endswith(f"/runs/{ids[-1]}/triage")
    _infra_error(client, db_session, submit, settings)
    assert len(_messages(db_session)) == 1  # the same streak goes on: no second message
    ok = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"branch": "main"}}, headers=submit).json()
    finish(db_session, ok["id"], "pass")
    for _ in range(3):
        _infra_error(client, db_session, submit, settings)
    assert len(_messages(db_session)) == 2  # a new streak after a result: notified again


def _could_not_tell(client: TestClient, db: Session, headers: dict[str, str]) -> int:
    """A run whose job ran but gave no answer: the evaluator's `error` (a rank killed from outside)."""
    body = {"spec": SPEC, "labels": {"branch": "main"}}
    run_id = client.post("/api/v1/runs", json=body, headers=headers).json()["id"]
    finish(db, run_id, "error", errors=[{"type": "ChildCrashed", "message": "rank 1 was killed (SIGKILL)",
                                         "traceback": "", "stage": "job", "rank": 1}])
    return int(run_id)


def test_an_error_verdict_is_infrastructures_streak_not_the_builds_regression(
    client: TestClient, db_session: Session, make_token, receiver_channel: NotificationChannel,
    streak_of_two: Settings,
) -> None:
    """Pass, then errors: no regression opens and the history's last good run stays the pass; the third error in a
    row alerts infrastructure once. A fail after them opens the regression against that pass; an error after it
    neither resolves nor joins it, and the next pass resolves it."""
    from models import Regression

    submit = make_token("submit")
    good = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"branch": "main"}}, headers=submit).json()["id"]
    finish(db_session, good, "pass")
    errors = [_could_not_tell(client, db_session, submit) for _ in range(3)]
    for run_id in errors:
        run = db_session.get(Run, run_id)
        assert run is not None and run.verdict == "error" and run.regression is False
    assert db_session.scalars(select(Regression)).all() == []
    (message,) = _messages(db_session)
    assert message.payload["runs"] == errors
    bad = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"branch": "main"}}, headers=submit).json()["id"]
    failed = finish(db_session, bad, "fail", ["model-weights-mismatch"])
    assert failed.regression is True and failed.last_good_run_id == good  # the errors broke no history
    (regression,) = db_session.scalars(select(Regression)).all()
    _could_not_tell(client, db_session, submit)
    db_session.refresh(regression)
    assert regression.state == "open" and regression.failing_run_ids == [bad]
    fixed = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"branch": "main"}}, headers=submit).json()["id"]
    finish(db_session, fixed, "pass")
    db_session.refresh(regression)
    assert regression.state == "resolved" and regression.fixed_by_run_id == fixed
