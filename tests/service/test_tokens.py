"""Tokens: expiry, list and revoke, last use; idempotency keys per token; who may cancel or rerun."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from models import ApiToken
from models.base import utcnow
from service.core.db import session_scope
from service.core.tokens import create_token
from tests.plugins.scheduler_harness import PARITY, service_env

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 4, "save_step": 2}


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_an_expired_token_is_refused(client: TestClient, db_session: Session) -> None:
    fresh = create_token(db_session, name="short", scopes=["submit"], tracks=["*"], expires_in=timedelta(hours=1))
    assert client.post("/api/v1/runs", json={"spec": SPEC}, headers=_bearer(fresh)).status_code == 202
    old = create_token(db_session, name="old", scopes=["submit"], tracks=["*"], expires_in=timedelta(hours=1))
    row = db_session.query(ApiToken).filter_by(name="old").one()
    row.expires_at = utcnow() - timedelta(seconds=1)
    db_session.flush()
    resp = client.post("/api/v1/runs", json={"spec": SPEC}, headers=_bearer(old))
    assert resp.status_code == 401 and "expired" in resp.json()["detail"], resp.text


def test_idempotency_keys_belong_to_their_token(client: TestClient, make_token) -> None:
    a = {**make_token("submit", name="ci-a"), "Idempotency-Key": "build-1"}
    b = {**make_token("submit", name="ci-b"), "Idempotency-Key": "build-1"}
    run_a = client.post("/api/v1/runs", json={"spec": SPEC}, headers=a)
    run_b = client.post("/api/v1/runs", json={"spec": {**SPEC, "steps": 6}}, headers=b)
    assert run_a.status_code == run_b.status_code == 202, (run_a.text, run_b.text)
    assert run_a.json()["id"] != run_b.json()["id"]  # same key, different tokens: two runs, no 409
    again = client.post("/api/v1/runs", json={"spec": SPEC}, headers=a)
    assert again.json()["id"] == run_a.json()["id"] and again.headers["Idempotent-Replayed"] == "true"


def test_a_replay_with_different_labels_is_a_conflict(client: TestClient, make_token) -> None:
    headers = {**make_token("submit"), "Idempotency-Key": "build-2"}
    first = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": "aaa"}}, headers=headers)
    assert first.status_code == 202
    same = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": "aaa"}}, headers=headers)
    assert same.status_code == 202 and same.json()["id"] == first.json()["id"]
    other = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"commit": "bbb"}}, headers=headers)
    assert other.status_code == 409 and "labels" in other.json()["detail"], other.text


def test_only_the_requester_or_an_admin_may_cancel_or_rerun(client: TestClient, make_token) -> None:
    owner, stranger, admin = make_token("submit", name="owner"), make_token("submit", name="x"), make_token("admin")
    run_id = client.post("/api/v1/runs", json={"spec": SPEC}, headers=owner).json()["id"]
    for action in ("cancel", "rerun"):
        resp = client.post(f"/api/v1/runs/{run_id}/{action}", headers=stranger)
        assert resp.status_code == 403 and "'owner'" in resp.json()["detail"], (action, resp.text)
    rerun = client.post(f"/api/v1/runs/{run_id}/rerun", headers=owner)
    assert rerun.status_code == 202 and rerun.json()["requester"] == "owner"
    assert client.post(f"/api/v1/runs/{run_id}/cancel", headers=owner).json()["state"] == "cancelled"
    other = rerun.json()["id"]
    assert client.post(f"/api/v1/runs/{other}/cancel", headers=admin).json()["state"] == "cancelled"


def test_token_list_and_revoke_from_the_command_line(committed_db: str, tmp_path: Path) -> None:
    env = service_env(tmp_path)

    def parity(*args: str) -> str:
        done = subprocess.run([*PARITY, "token", *args], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    secret = parity("create", "--name", "ci-main", "--scope", "submit", "--track", "main",
                    "--expires-days", "30").strip()
    parity("create", "--name", "dashboard", "--scope", "read")
    with session_scope() as session:  # a request with the token records its use
        from service.core.tokens import authenticate

        authenticate(session, token=secret, scope="submit")
    tokens = {t["name"]: t for t in json.loads(parity("list", "--json"))}
    main = tokens["ci-main"]
    assert main["scopes"] == ["submit"] and main["last_used_at"] and main["revoked_at"] is None
    assert 29 <= (utcnow().fromisoformat(main["expires_at"]) - utcnow()).days <= 30
    assert tokens["dashboard"]["expires_at"] is None and tokens["dashboard"]["last_used_at"] is None
    table = parity("list")
    assert table.splitlines()[0].split()[:3] == ["id", "name", "scopes"] and "ci-main" in table
    assert "revoked token" in parity("revoke", str(main["id"]))
    assert {t["name"]: t for t in json.loads(parity("list", "--json"))}["ci-main"]["revoked_at"]
    with session_scope() as session:
        from service.core.errors import Unauthorized
        from service.core.tokens import authenticate

        try:
            authenticate(session, token=secret, scope="submit")
        except Unauthorized as exc:
            assert "revoked" in str(exc)
        else:
            raise AssertionError("a revoked token still authenticates")
    bad = subprocess.run([*PARITY, "token", "revoke", "999999"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "does not exist" in bad.stderr
