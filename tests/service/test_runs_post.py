"""POST /runs from a token the process has seen before: answered and stored as the first POST was.

A token this process authenticated once is remembered, yet a revoked or expired token stops working
on the very next request, an unusable environment is refused with its precise error, and a repeated
Idempotency-Key inserts nothing. Against a real uvicorn, concurrent POSTs (which share commits) each
queue exactly their own run, and concurrent repeats of one key queue one.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from models import ApiToken, Environment, Run, RunEvent
from models.base import utcnow
from service.core import tokens
from service.core.db import session_scope

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}
# differ from run to run
VARYING = {"id", "created_at", "links", "labels"}


def _post(client: TestClient | httpx.Client, headers: dict[str, str], commit: str):
    return client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": commit, "branch": "b"}},
                       headers=headers)


def _secret(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def _revoke(session: Session, headers: dict[str, str], **values: object) -> None:
    session.execute(update(ApiToken).where(ApiToken.token_hash == tokens.hash_token(_secret(headers)))
                    .values(**values))


def test_a_second_post_answers_and_stores_like_the_first(client: TestClient, make_token,
                                                         db_session: Session) -> None:
    headers = make_token("submit")
    first = _post(client, headers, "c1")  # the token looked up, the environment created
    second = _post(client, headers, "c2")  # the token remembered, the environment usable
    assert first.status_code == second.status_code == 202, (first.text, second.text)
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
    assert client.get(f"/api/v1/runs/{b['id']}").json() == {**b, "phases": []}


def test_a_revoked_token_stops_working_at_once(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "c1").status_code == 202
    assert _post(client, headers, "c2").status_code == 202  # remembered now
    _revoke(db_session, headers, revoked_at=utcnow())
    refused = _post(client, headers, "c3")
    assert refused.status_code == 401, refused.text
    assert "revoked" in refused.json()["detail"]
    assert db_session.scalar(select(Run.id).where(Run.labels["commit"].astext == "c3")) is None


def test_an_expired_token_stops_working_though_remembered(client: TestClient, make_token,
                                                          db_session: Session) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "c1").status_code == 202
    assert _post(client, headers, "c2").status_code == 202
    _revoke(db_session, headers, expires_at=utcnow() - timedelta(seconds=1))
    refused = _post(client, headers, "c3")
    assert refused.status_code == 401 and "expired" in refused.json()["detail"]
    assert db_session.scalar(select(Run.id).where(Run.labels["commit"].astext == "c3")) is None


def test_a_failed_environment_is_refused_though_it_was_usable_a_moment_ago(client: TestClient, make_token,
                                                                           db_session: Session) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "c1").status_code == 202
    assert _post(client, headers, "c2").status_code == 202
    db_session.execute(update(Environment).where(Environment.name == "default").values(state="failed"))
    refused = _post(client, headers, "c3")
    assert refused.status_code == 409 and "failed to build" in refused.json()["detail"]
    assert refused.json()["field"] == "environment"


def test_a_replayed_idempotency_key_is_answered_with_the_first_run(client: TestClient, make_token,
                                                                   db_session: Session) -> None:
    headers = make_token("submit")
    assert _post(client, headers, "warm").status_code == 202  # the token is remembered from here on
    keyed = {**headers, "Idempotency-Key": "k-1"}
    first = _post(client, keyed, "c1")
    again = _post(client, keyed, "c1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    assert _post(client, keyed, "c2").status_code == 409
    assert db_session.scalar(select(func.count()).select_from(Run).where(Run.idempotency_key == "k-1")) == 1


def _live_token() -> dict[str, str]:
    with session_scope() as session:
        return {"Authorization": f"Bearer {tokens.create_token(session, name='ci', scopes=['submit'], tracks=['*'])}"}


def _at_once(n: int, call) -> list:  # type: ignore[no-untyped-def]
    """call(i) from n threads released together; -> the results in i order."""
    start, results = threading.Barrier(n), [None] * n

    def one(i: int) -> None:
        start.wait()
        results[i] = call(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_concurrent_posts_each_queue_their_own_run(live_api: str, committed_db: str) -> None:
    headers = _live_token()
    with httpx.Client(base_url=live_api, timeout=30) as client:
        assert _post(client, headers, "warm").status_code == 202
        answers = _at_once(24, lambda i: _post(client, headers, f"c{i}"))
        assert [a.status_code for a in answers] == [202] * 24, [a.text for a in answers if a.status_code != 202]
        ids = [a.json()["id"] for a in answers]
        assert len(set(ids)) == 24
        for i, run_id in enumerate(ids):  # each answer is its own request's run, committed and readable
            assert answers[i].json()["labels"]["commit"] == f"c{i}"
            assert client.get(f"/api/v1/runs/{run_id}").json()["labels"]["commit"] == f"c{i}"
    with session_scope() as session:
        rows = session.execute(select(Run.id, Run.labels["commit"].astext).where(Run.id.in_(ids))).all()
        stored = {run_id: commit for run_id, commit in rows}
        assert stored == {run_id: f"c{i}" for i, run_id in enumerate(ids)}
        events = session.execute(select(RunEvent.run_id, RunEvent.to_state).where(RunEvent.run_id.in_(ids))).all()
        assert sorted(events) == sorted((run_id, "queued") for run_id in ids)


def test_concurrent_repeats_of_one_key_queue_one_run(live_api: str, committed_db: str) -> None:
    headers = _live_token()
    keyed = {**headers, "Idempotency-Key": uuid.uuid4().hex}
    with httpx.Client(base_url=live_api, timeout=30) as client:
        assert _post(client, headers, "warm").status_code == 202
        answers = _at_once(8, lambda _: _post(client, keyed, "same"))
    assert [a.status_code for a in answers] == [202] * 8, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Run).where(Run.labels["commit"].astext == "same")) == 1


def test_a_token_revoked_elsewhere_stops_working_on_a_live_server(live_api: str, committed_db: str) -> None:
    headers = _live_token()
    with httpx.Client(base_url=live_api, timeout=30) as client:
        assert [_post(client, headers, f"c{i}").status_code for i in range(2)] == [202, 202]
        with session_scope() as session:  # another process (`parity token revoke`) commits the revocation
            _revoke(session, headers, revoked_at=utcnow())
        refused = _post(client, headers, "after")
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"], refused.text
    with session_scope() as session:
        assert session.scalar(select(Run.id).where(Run.labels["commit"].astext == "after")) is None
