"""POST /runs and GET /runs/{id} in one statement (service/runs/one_statement.py, group_commit.py).

A token this process authenticated once is remembered; the INSERT itself re-checks revocation and
expiry, so a revoked token stops working on the very next request. The one-statement path answers
exactly what the ORM path answers. Concurrent POSTs share one commit, each gets its own row, and a
row that cannot be stored fails only its own request.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models import ApiToken, Run, RunEvent
from models.base import utcnow
from service.core import tokens
from service.core.check_spec import run_spec_of
from service.core.db import new_session, session_scope
from service.core.settings import get_settings
from service.environments.registry import ensure_default_environment, use_environment
from service.runs import group_commit, one_statement

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}
# differ from run to run, or name the path taken
VARYING = {"id", "created_at", "links", "labels"}


def _post(client: TestClient, headers: dict[str, str], commit: str):
    return client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": commit, "branch": "b"}},
                       headers=headers)


def _secret(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def test_second_post_uses_the_remembered_token_and_answers_like_the_first(client: TestClient, make_token,
                                                                          db_session: Session) -> None:
    headers = make_token("submit")
    first = _post(client, headers, "c1")  # authenticated in the database, environment created: ORM path
    assert first.status_code == 202, first.text
    assert tokens.recall(_secret(headers), "submit") is not None
    second = _post(client, headers, "c2")  # remembered token, usable environment: one statement
    assert second.status_code == 202, second.text
    a, b = first.json(), second.json()
    assert {k: v for k, v in a.items() if k not in VARYING} == {k: v for k, v in b.items() if k not in VARYING}
    assert b["labels"] == {"commit": "c2", "branch": "b"}
    assert second.headers["Location"] == f"/api/v1/runs/{b['id']}"
    # stored alike too: the run row's columns and its queued event
    rows = {r.id: r for r in db_session.scalars(select(Run).where(Run.id.in_([a["id"], b["id"]])))}
    skip = {"id", "created_at", "updated_at", "labels"}
    columns = [c.name for c in Run.__table__.c if c.name not in skip]
    assert [getattr(rows[a["id"]], c) for c in columns] == [getattr(rows[b["id"]], c) for c in columns]
    events = db_session.execute(select(RunEvent.run_id, RunEvent.from_state, RunEvent.to_state, RunEvent.reason)
                                .where(RunEvent.run_id.in_([a["id"], b["id"]])).order_by(RunEvent.run_id)).all()
    assert [tuple(e)[1:] for e in events] == [(None, "queued", "queued by API")] * 2
    # and read back alike through the one-statement GET
    assert client.get(f"/api/v1/runs/{b['id']}").json() == {**b, "phases": []}


def test_a_revoked_token_stops_working_at_once(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "c1").status_code == 202
    assert _post(client, headers, "c2").status_code == 202  # remembered now
    assert tokens.recall(_secret(headers), "submit") is not None
    db_session.execute(update(ApiToken).where(ApiToken.token_hash == tokens.hash_token(_secret(headers)))
                       .values(revoked_at=utcnow()))
    refused = _post(client, headers, "c3")
    assert refused.status_code == 401, refused.text
    assert "revoked" in refused.json()["detail"]
    assert tokens.recall(_secret(headers), "submit") is None  # forgotten: the next request looks it up
    assert db_session.scalar(select(Run.id).where(Run.labels["commit"].astext == "c3")) is None


def test_an_expired_token_stops_working_though_remembered(client: TestClient, make_token,
                                                          db_session: Session) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "c1").status_code == 202
    db_session.execute(update(ApiToken).where(ApiToken.token_hash == tokens.hash_token(_secret(headers)))
                       .values(expires_at=utcnow() - timedelta(seconds=1)))
    refused = _post(client, headers, "c2")
    assert refused.status_code == 401 and "expired" in refused.json()["detail"]


def test_a_failed_environment_is_refused_on_the_one_statement_path(client: TestClient, make_token,
                                                                   db_session: Session) -> None:
    from models import Environment

    headers = make_token("submit")
    assert _post(client, headers, "c1").status_code == 202
    db_session.execute(update(Environment).where(Environment.name == "default").values(state="failed"))
    refused = _post(client, headers, "c2")
    assert refused.status_code == 409 and "failed to build" in refused.json()["detail"]


def test_a_replayed_idempotency_key_is_answered_with_the_first_run(client: TestClient, make_token) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "warm").status_code == 202  # the token is remembered from here on
    keyed = {**headers, "Idempotency-Key": "k-1"}
    first = _post(client, keyed, "c1")
    again = _post(client, keyed, "c1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert _post(client, keyed, "c2").status_code == 409


@pytest.fixture
def queued_by_engine(committed_db: str):
    """A token and a usable default environment, committed; insert_run through the process engine."""
    with session_scope() as session:
        tokens.create_token(session, name="group", scopes=["submit"], tracks=["*"])
        token_id = session.scalar(select(ApiToken.id).where(ApiToken.name == "group"))
        assert token_id is not None
        use_environment(ensure_default_environment(session, settings=get_settings()))

    def insert(commit: str) -> one_statement.Stored | None:
        session = new_session()
        try:
            return one_statement.insert_run(session, spec=run_spec_of(SPEC), environment="default",
                                            labels={"commit": commit}, requester="group", token_id=token_id,
                                            idempotency_key=None, job_python=None)
        finally:
            session.close()

    return insert


@pytest.mark.engine
def test_concurrent_posts_share_commits_and_each_gets_its_own_row(queued_by_engine, monkeypatch) -> None:
    batches: list[int] = []
    write = one_statement.write_batch

    def counting(conn, items):  # type: ignore[no-untyped-def]
        batches.append(len(items))
        return write(conn, items)

    monkeypatch.setattr(one_statement, "write_batch", counting)
    results: dict[str, one_statement.Stored | None] = {}
    start = threading.Barrier(24)

    def post(i: int) -> None:
        start.wait()
        results[f"c{i}"] = queued_by_engine(f"c{i}")

    threads = [threading.Thread(target=post, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None and r.labels == {"commit": c} for c, r in results.items())
    assert len({r.id for r in results.values() if r}) == 24
    assert sum(batches) == 24 and max(batches) > 1, batches  # at least one commit carried several runs
    seventh = results["c7"]
    assert seventh is not None
    with session_scope() as session:  # committed: visible to a new transaction
        assert session.scalar(select(Run.id).where(Run.labels["commit"].astext == "c7")) == seventh.id


@pytest.mark.engine
def test_a_row_that_cannot_be_stored_fails_only_its_own_request(queued_by_engine) -> None:
    # a NUL cannot be stored in JSONB: that request fails as it did on the ORM path, its batch-mates succeed
    errors: list[BaseException] = []
    results: list[one_statement.Stored | None] = []
    start = threading.Barrier(8)

    def post(commit: str) -> None:
        start.wait()
        try:
            results.append(queued_by_engine(commit))
        except Exception as exc:  # the request's own error
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(c,)) for c in ["bad\x00", *(f"ok{i}" for i in range(7))]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and len(results) == 7 and all(r is not None for r in results)
    assert group_commit.MAX_BATCH >= 8


def test_a_batch_whose_connection_broke_is_not_sent_again(database_url: str) -> None:
    # row by row after a lost connection could queue twice a run whose commit did happen: each request
    # of the batch gets the loss (a 503), and no item is ever handed to the database a second time
    from sqlalchemy import create_engine

    from service.core.driver_cursor import ConnectionLost

    engine = create_engine(database_url)
    sent: list[list[int]] = []
    first_in = threading.Event()

    def write(_conn, items):
        sent.append([item["n"] for item in items])
        if len(sent) == 1:
            first_in.set()
            threading.Event().wait(0.5)  # the others queue behind this one and form a batch
        raise ConnectionLost("connection lost: terminating connection due to administrator command")

    errors: list[BaseException] = []

    def post(n: int) -> None:
        try:
            group_commit.submit(engine, {"n": n}, write)
        except ConnectionLost as exc:
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(0,))]
    threads[0].start()
    assert first_in.wait(10)
    threads += [threading.Thread(target=post, args=(n,)) for n in range(1, 5)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(30)
    engine.dispose()
    assert len(errors) == 5
    assert sorted(n for batch in sent for n in batch) == [0, 1, 2, 3, 4], sent  # each item sent once
    assert max(len(batch) for batch in sent) >= 2, sent  # a batch did form


def test_the_writer_outlives_a_failure_outside_its_statement(database_url: str) -> None:
    # a write that hands back too few rows (a bug) fails its own request; the writer thread must not
    # die with it, or every later POST of the process would wait forever on a writer that is gone
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    calls: list[int] = []

    def write(_conn, items):
        calls.append(len(items))
        return [] if len(calls) == 1 else [("row", item["n"]) for item in items]

    done: list[object] = []

    def post(n: int) -> None:
        try:
            done.append(group_commit.submit(engine, {"n": n}, write))
        except ValueError as exc:
            done.append(type(exc))

    for n in (1, 2):  # each in a thread with a deadline: without the fix the first one waits forever
        request = threading.Thread(target=post, args=(n,), daemon=True)
        request.start()
        request.join(10)
    engine.dispose()
    assert done == [ValueError, ("row", 2)]
