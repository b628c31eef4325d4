"""Names and state belong to someone: the review's squatted `default`, acknowledged `main` and public listing.

Rows 4, 6 and 8 of the review (issue 44): a submit token created an environment named `default` on a fresh
install (every run naming no environment then ran its build); a `pr-*` token acknowledged a regression on
`main` and pointed its upstream link outside; an unauthenticated GET listed every tenant's wheels.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import zipfile
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Environment, Regression, Run, Source, Track
from models.base import utcnow
from service.core.settings import get_settings
from service.environments.build_steps import own_copies
from tests.plugins.verdict_helpers import finish

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3}
WHEEL = "megatron_core-0.16.1-py3-none-any.whl"
OCTET = {"content-type": "application/octet-stream"}


def _wheel(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo("megatron/__init__.py", date_time=(2026, 12, 1, 0, 0, 0)), payload)
    return buf.getvalue()


def _refused_name(resp, name: str) -> None:  # type: ignore[no-untyped-def]
    assert resp.status_code == 403, resp.text
    assert resp.json()["field"] == "name" and repr(name) in resp.json()["detail"], resp.json()


def test_a_submit_token_may_not_take_a_reserved_environment_name(
    client: TestClient, make_token, db_session: Session
) -> None:
    """`default` (on a fresh install: no row yet), a watched track's name, a track the token may not write and
    the service's own name forms are refused before anything is stored; an admin may name anything."""
    ci = make_token("submit", name="ci", tracks=("pr-*",))
    source = Source(name="mcore", kind="tree", location="/nowhere")
    db_session.add(source)
    db_session.flush()
    db_session.add(Track(name="pr-nightly", source_id=source.id, suite="small", every_seconds=3600,
                         next_run_at=utcnow()))
    db_session.flush()
    assert db_session.scalar(select(Environment).where(Environment.name == "default")) is None
    for name in ("default", "pr-nightly", "main", "build-0123456789ab"):
        _refused_name(client.post("/api/v1/environments", headers=ci,
                                  json={"name": name, "requirements": ["megatron-core==0.15.3"]}), name)
    assert db_session.scalar(select(Environment.id).where(Environment.name != "")) is None
    # a run naming no environment still gets the service's own Python
    assert client.post("/api/v1/runs", headers=make_token("submit", name="main", tracks=("main",)),
                       json={"spec": SPEC, "labels": {"branch": "main"}}).status_code == 202
    assert db_session.scalar(select(Environment.python).where(Environment.name == "default")) == \
        (get_settings().job_python or sys.executable)
    # a name the token's tracks grant is its own to take
    mine = client.post("/api/v1/environments", headers=ci,
                       json={"name": "pr-7", "requirements": ["megatron-core==0.16.1"]})
    assert mine.status_code == 201, mine.text
    admin = client.post("/api/v1/environments", headers=make_token("admin"),
                        json={"name": "main", "requirements": ["megatron-core==0.15.3"]})
    assert admin.status_code == 201, admin.text


def _regression_on(db: Session, client: TestClient, headers: dict[str, str], track: str) -> int:
    for verdict in ("pass", "fail"):
        run = client.post("/api/v1/runs", json={"spec": SPEC, "labels": {"branch": track}}, headers=headers).json()
        row = db.get(Run, run["id"])
        assert row is not None
        row.summary = {"packages": {"megatron_core": "0.16.1"}}
        finish(db, run["id"], verdict, ["optimizer-index-misalignment"] if verdict == "fail" else [])
    reg = db.scalar(select(Regression).where(Regression.track == track))
    assert reg is not None
    return reg.id


def test_acknowledging_a_regression_needs_its_track(client: TestClient, make_token, db_session: Session) -> None:
    """A `pr-*` token may not acknowledge (nor annotate) `main`'s regression: 403 naming the track, nothing
    changed; `main`'s own token may."""
    main = make_token("submit", name="main-ci", tracks=("main",))
    reg_id = _regression_on(db_session, client, main, "main")
    ci = make_token("submit", name="ci", tracks=("pr-*",))
    refused = client.post(f"/api/v1/regressions/{reg_id}/acknowledge", headers=ci,
                          json={"note": "not a bug", "upstream_url": "https://evil.example/x"})
    assert refused.status_code == 403 and refused.json()["field"] == "track", refused.text
    assert "'main'" in refused.json()["detail"] and "'pr-*'" in refused.json()["detail"]
    db_session.expire_all()
    reg = db_session.get(Regression, reg_id)
    assert reg is not None and reg.state == "open" and reg.upstream_url is None and reg.acknowledged_by is None
    ok = client.post(f"/api/v1/regressions/{reg_id}/acknowledge", headers=main, json={"note": "mine"})
    assert ok.status_code == 200 and ok.json()["acknowledged_by"] == "main-ci", ok.text


def test_the_artifact_listing_needs_a_token_and_shows_only_its_own(client: TestClient, make_token) -> None:
    alice, bob = make_token("submit", name="alice"), make_token("submit", name="bob")
    mine = client.post("/api/v1/artifacts", params={"filename": WHEEL}, content=_wheel(b"alice"),
                       headers={**alice, **OCTET}).json()
    theirs = client.post("/api/v1/artifacts", params={"filename": WHEEL}, content=_wheel(b"bob"),
                         headers={**bob, **OCTET}).json()
    assert client.get("/api/v1/artifacts").status_code == 401
    assert [a["sha256"] for a in client.get("/api/v1/artifacts", headers=alice).json()] == [mine["sha256"]]
    assert [a["sha256"] for a in client.get("/api/v1/artifacts", headers=bob).json()] == [theirs["sha256"]]
    every = client.get("/api/v1/artifacts", headers=make_token("admin")).json()
    assert {a["sha256"] for a in every} == {mine["sha256"], theirs["sha256"]}


def test_stored_wheels_are_the_services_and_a_build_gets_its_own_copy(
    client: TestClient, make_token, tmp_path: Path
) -> None:
    """Stored uploads are 0600 in 0700 folders (no job user reads another tenant's wheel); a build's job
    installs from a copy in its own folder, made without following a link a job left there."""
    headers = {**make_token("submit", name="alice"), **OCTET}
    art = client.post("/api/v1/artifacts", params={"filename": WHEEL}, content=_wheel(b"x"), headers=headers).json()
    stored = get_settings().resolved_artifact_folder / art["sha256"] / WHEEL
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    build = tmp_path / "build"
    build.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", build / "uploads")  # planted by an earlier attempt's job
    line = f"artifact:{art['sha256']}"
    out = own_copies(build, ["einops==0.8.1", line], ["einops==0.8.1", str(stored)])
    copy = build / "uploads" / art["sha256"] / WHEEL
    assert out == ["einops==0.8.1", str(copy)]
    assert copy.read_bytes() == stored.read_bytes() and not (build / "uploads").is_symlink()
    assert list((tmp_path / "elsewhere").iterdir()) == []
