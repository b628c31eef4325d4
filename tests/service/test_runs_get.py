"""GET /runs/{id}: the run as POST answered it, with its phases; a 404 as elsewhere; the read token
checked; a 503 (nothing lost) while the database is away, and served again once it is back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import make_url

from models import Phase
from service.core import tokens
from service.core.db import reset_engine, session_scope
from service.core.settings import get_settings
from tests.plugins.tcp_proxy import Proxy

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}


@pytest.fixture
def served(committed_db: str) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """A client on the real app (no session override: requests commit) and a submit token."""
    from service.web.app import create_app

    with session_scope() as session:
        secret = tokens.create_token(session, name="reader", scopes=["submit"], tracks=["*"])
    with TestClient(create_app()) as client:
        yield client, {"Authorization": f"Bearer {secret}"}


def test_a_run_reads_back_as_posted_with_its_phases_in_order(served: tuple[TestClient, dict[str, str]]) -> None:
    client, headers = served
    posted = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": "c1"}}, headers=headers)
    assert posted.status_code == 202, posted.text
    run_id = posted.json()["id"]
    got = client.get(f"/api/v1/runs/{run_id}")
    assert got.status_code == 200, got.text
    assert got.json() == {**posted.json(), "phases": []}
    assert got.json()["links"]["self"] == f"http://testserver/api/v1/runs/{run_id}"
    with session_scope() as session:  # the scheduler's rows, as it writes them
        session.add_all([Phase(run_id=run_id, name="baseline", executor="local", state="succeeded",
                               info={"rank_nodes": ["n1", "n2"]}),
                         Phase(run_id=run_id, name="resume", executor="local", state="running")])
    phases = client.get(f"/api/v1/runs/{run_id}").json()["phases"]
    assert [(p["name"], p["state"], p["rank_nodes"]) for p in phases] == [
        ("baseline", "succeeded", ["n1", "n2"]), ("resume", "running", [])]
    listed = client.get("/api/v1/runs").json()["items"][0]
    assert listed == {**posted.json(), "phases": None}


def test_an_absent_run_is_the_same_404(served: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = served
    missing = client.get("/api/v1/runs/99999")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found" and "99999" in missing.json()["detail"]
    assert missing.json()["field"] == "run_id"


def test_a_read_token_is_checked_with_or_without_a_stored_run(
    served: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, headers = served
    run_id = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": "c1"}}, headers=headers).json()["id"]
    monkeypatch.setenv("PARITY_READS_REQUIRE_TOKEN", "1")
    get_settings.cache_clear()
    with session_scope() as session:
        reader = {"Authorization": f"Bearer {tokens.create_token(session, name='r', scopes=['read'])}"}
    for path in (f"/api/v1/runs/{run_id}", "/api/v1/runs/99999"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer prt_wrong"}).status_code == 401, path
    assert client.get(f"/api/v1/runs/{run_id}", headers=reader).json()["id"] == run_id
    assert client.get("/api/v1/runs/99999", headers=reader).status_code == 404


def test_a_read_answers_503_while_the_database_is_away_and_200_once_it_is_back(
    committed_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.web.app import create_app

    with session_scope() as session:
        secret = tokens.create_token(session, name="reader", scopes=["submit"], tracks=["*"])
    real = make_url(committed_db)
    proxy = Proxy(real.host or "127.0.0.1", real.port or 5432)
    monkeypatch.setenv("PARITY_DATABASE_URL",
                       real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
    get_settings.cache_clear()
    reset_engine()
    try:
        with TestClient(create_app()) as client:
            posted = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": "c1"}},
                                 headers={"Authorization": f"Bearer {secret}"})
            assert posted.status_code == 202, posted.text
            run_id = posted.json()["id"]
            assert client.get(f"/api/v1/runs/{run_id}").status_code == 200
            proxy.down()  # the pooled connection breaks and no new one can be made
            away = client.get(f"/api/v1/runs/{run_id}")
            assert away.status_code == 503, away.text
            assert away.json()["error"] == "database_unavailable"
            # the broken pooled connection was dropped with its pool: the next send may well be served
            assert away.headers["Retry-After"] == "1"
            proxy.restore()
            back = client.get(f"/api/v1/runs/{run_id}")  # a fresh connection, the same run
            assert back.status_code == 200, back.text
            assert back.json()["id"] == run_id
    finally:
        proxy.close()
        reset_engine()
