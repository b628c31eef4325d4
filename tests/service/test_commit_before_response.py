"""A 202 means the run is stored: the request's commit happens before the response is sent.

Run against the real `get_session` dependency (no override) behind a real uvicorn server, with every
commit slowed down: had the commit run after the response (FastAPI's default for yield
dependencies), the client would hold a 202 while the row was still invisible to anyone else.
"""

from __future__ import annotations

import time

import httpx
import psycopg
from sqlalchemy import event, make_url
from sqlalchemy.orm import Session

from service.core.db import session_scope
from service.core.tokens import create_token

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 4, "save_step": 2}
COMMIT_DELAY_S = 0.8


def _slow_commit(session: Session) -> None:
    time.sleep(COMMIT_DELAY_S)


def test_a_202_run_is_already_visible_to_another_connection(live_api: str, committed_db: str) -> None:
    with session_scope() as session:
        headers = {"Authorization": f"Bearer {create_token(session, name='ci', scopes=['submit'], tracks=['*'])}"}
    plain = make_url(committed_db).set(drivername="postgresql").render_as_string(hide_password=False)
    event.listen(Session, "before_commit", _slow_commit)
    try:
        with httpx.Client(base_url=live_api, timeout=30) as client, psycopg.connect(plain, autocommit=True) as db:
            for _ in range(3):
                resp = client.post("/api/v1/runs", json={"spec": SPEC}, headers=headers)
                assert resp.status_code == 202, resp.text
                run_id = resp.json()["id"]
                # the same instant, from a connection that is not the request's
                row = db.execute("select state from runs where id = %s", (run_id,)).fetchone()
                assert row == ("queued",), f"run {run_id} answered 202 but is not stored yet"
                location = client.get(resp.headers["Location"])
                assert location.status_code == 200, location.text
    finally:
        event.remove(Session, "before_commit", _slow_commit)


def test_a_failed_commit_is_not_answered_with_202(live_api: str, committed_db: str) -> None:
    """A commit that fails (here: the database refuses it) is an error response, never a 202."""
    with session_scope() as session:
        headers = {"Authorization": f"Bearer {create_token(session, name='ci', scopes=['submit'], tracks=['*'])}"}

    def refuse(session: Session) -> None:
        from sqlalchemy.exc import OperationalError

        raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))

    event.listen(Session, "before_commit", refuse)
    try:
        resp = httpx.post(f"{live_api}/api/v1/runs", json={"spec": SPEC}, headers=headers, timeout=30)
    finally:
        event.remove(Session, "before_commit", refuse)
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"] == "database_unavailable"
    with session_scope() as session:
        from sqlalchemy import func, select

        from models import Run

        assert session.scalar(select(func.count()).select_from(Run)) == 0


def test_concurrent_first_requests_all_get_202(live_api: str, committed_db: str) -> None:
    """The default environment is created on first use: racing first requests must not 500 on its name."""
    from concurrent.futures import ThreadPoolExecutor

    with session_scope() as session:  # one token per client, as in CI (one token's row would serialise them)
        tokens = [create_token(session, name=f"ci-{i}", scopes=["submit"], tracks=["*"]) for i in range(6)]
    event.listen(Session, "before_commit", _slow_commit)  # widen the race: every creator is still uncommitted
    try:
        with ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(
                lambda t: httpx.post(f"{live_api}/api/v1/runs", json={"spec": SPEC}, timeout=60,
                                     headers={"Authorization": f"Bearer {t}"}).status_code, tokens))
    finally:
        event.remove(Session, "before_commit", _slow_commit)
    assert codes == [202] * 6
