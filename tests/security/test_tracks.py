"""Tracks belong to someone: the review's submit token resolved another PR's regression with `branch=victim-pr`.

A token is granted fnmatch patterns of the tracks it may write (a run's `branch` label, else its
environment's name); every route that queues runs refuses a track outside them with a 403 naming
the label and the patterns, before anything is written. Admin tokens may write any track.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from models import ApiToken, Run
from service.core.settings import get_settings
from service.core.tokens import create_token
from service.environments.registry import create_environment, ensure_default_environment
from service.runs.records import create_run

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3}
SUITE = {"name": "small", "description": "one check", "checks": [{"name": "dense", "spec": SPEC}]}


def _runs(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Run)) or 0


def _refused(resp, field: str, track: str) -> None:  # type: ignore[no-untyped-def]
    assert resp.status_code == 403, resp.text
    body = resp.json()
    assert body["field"] == field and repr(track) in body["detail"] and "'pr-*'" in body["detail"], body


def test_a_pr_token_may_not_write_another_track(client: TestClient, make_token, db_session: Session) -> None:
    ci = make_token("submit", name="ci", tracks=("pr-*",))
    mine = client.post("/api/v1/runs", headers=ci, json={"spec": SPEC, "labels": {"branch": "pr-7"}})
    assert mine.status_code == 202 and mine.json()["track"] == "pr-7", mine.text
    before = _runs(db_session)
    # the same token again: this process remembers it, so the request takes the one-statement path
    _refused(client.post("/api/v1/runs", headers=ci, json={"spec": SPEC, "labels": {"branch": "victim-pr"}}),
             "labels.branch", "victim-pr")
    _refused(client.post("/api/v1/runs", headers=ci, json={"spec": SPEC, "labels": {"branch": "main"}}),
             "labels.branch", "main")
    # a fresh token's first request (the ORM path)
    fresh = make_token("submit", name="ci-2", tracks=("pr-*",))
    _refused(client.post("/api/v1/runs", headers=fresh, json={"spec": SPEC, "labels": {"branch": "victim-pr"}}),
             "labels.branch", "victim-pr")
    # no branch label: the track is the environment's name, which is nobody's PR
    _refused(client.post("/api/v1/runs", headers=ci, json={"spec": SPEC}), "environment", "default")
    # an Idempotency-Key replay is no way around it
    _refused(client.post("/api/v1/runs", headers={**ci, "Idempotency-Key": "k1"},
                         json={"spec": SPEC, "labels": {"branch": "victim-pr"}}), "labels.branch", "victim-pr")
    assert _runs(db_session) == before


def test_every_route_that_queues_runs_checks_the_track(
    client: TestClient, make_token, db_session: Session
) -> None:
    for name in ("env-a", "env-b"):
        create_environment(db_session, name=name, python=sys.executable)
    assert client.post("/api/v1/suites", json=SUITE, headers=make_token("admin")).status_code == 201
    ci = make_token("submit", name="ci", tracks=("pr-*",))
    victim = {"branch": "victim-pr"}
    _refused(client.post("/api/v1/suite-runs", headers=ci, json={"suite": "small", "labels": victim}),
             "labels.branch", "victim-pr")
    _refused(client.post("/api/v1/sweeps", headers=ci, json={"configs": ["dense-bf16"], "base": SPEC,
                                                              "labels": victim}), "labels.branch", "victim-pr")
    _refused(client.post("/api/v1/bisects", headers=ci, json={"spec": SPEC, "good": "env-a", "bad": "env-b",
                                                               "labels": victim}), "labels.branch", "victim-pr")
    _refused(client.post("/api/v1/bisects", headers=ci, json={"spec": SPEC, "good": "env-a", "bad": "env-b"}),
             "environment", "env-a")
    # a rerun writes the original's track: a run of this token there (queued before it had patterns) stays there
    token_id = db_session.scalar(select(ApiToken.id).where(ApiToken.name == "ci"))
    default = ensure_default_environment(db_session, settings=get_settings())
    old, _ = create_run(db_session, spec=RunSpec.from_dict(SPEC), environment=default, labels=victim,
                        requester="ci", token_id=token_id)
    _refused(client.post(f"/api/v1/runs/{old.id}/rerun", headers=ci), "labels.branch", "victim-pr")
    assert _runs(db_session) == 1
    # inside its patterns every route works
    pr = {"branch": "pr-8"}
    assert client.post("/api/v1/suite-runs", headers=ci, json={"suite": "small", "labels": pr}).status_code == 202
    assert client.post("/api/v1/sweeps", headers=ci, json={"configs": ["dense-bf16"], "base": SPEC,
                                                           "labels": pr}).status_code == 202


def test_admin_may_write_any_track_and_main_has_its_own_token(client: TestClient, make_token) -> None:
    admin = make_token("admin", tracks=())
    assert client.post("/api/v1/runs", headers=admin, json={"spec": SPEC, "labels": {"branch": "x"}}).status_code == 202
    main = make_token("submit", name="main-ci", tracks=("main",))
    assert client.post("/api/v1/runs", headers=main, json={"spec": SPEC, "labels": {"branch": "main"}}
                       ).status_code == 202
    refused = client.post("/api/v1/runs", headers=main, json={"spec": SPEC, "labels": {"branch": "main-2"}})
    assert refused.status_code == 403 and "'main'" in refused.json()["detail"]


def test_a_submit_token_must_name_its_tracks(db_session: Session) -> None:
    with pytest.raises(ValueError, match=r"tracks: a submit token must name the tracks .*--track 'pr-\*'"):
        create_token(db_session, name="ci", scopes=["submit"])
    with pytest.raises(ValueError, match=r"tracks: 'pr/\.\.\\x00' is not a track pattern; allowed"):
        create_token(db_session, name="ci", scopes=["submit"], tracks=["pr/..\x00"])
    assert create_token(db_session, name="reader", scopes=["read"])  # reads write no track
    assert create_token(db_session, name="ops", scopes=["admin"])


def test_parity_token_create_takes_tracks(settings_env: None, committed_db: str) -> None:
    parity = [sys.executable, "-m", "service.cli.main", "token"]
    refused = subprocess.run([*parity, "create", "--name", "ci", "--scope", "submit"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--track 'pr-*'" in refused.stderr, refused.stderr
    made = subprocess.run([*parity, "create", "--name", "ci", "--scope", "submit", "--track", "pr-*"],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and made.stdout.startswith("prt_"), made.stderr
    listed = subprocess.run([*parity, "list", "--json"], capture_output=True, text=True, timeout=60)
    assert '"pr-*"' in listed.stdout, listed.stdout
