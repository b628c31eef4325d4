"""Uploaded builds: streamed under their own size limit, stored once per SHA-256, built from, pruned."""

from __future__ import annotations

import hashlib
import io
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models import Artifact, Environment
from models.base import utcnow
from service.artifacts.store import prune_artifacts, resolve_lines
from service.core.limits import MAX_BODY_BYTES
from service.core.settings import get_settings
from service.environments.requirements import RequirementError, normalize, requirement_kind

WHEEL = "megatron_core-0.16.1+pr.123-py3-none-any.whl"
OCTET = {"content-type": "application/octet-stream"}


def _wheel(payload: bytes = b"x") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # a fixed time stamp: the same payload is the same bytes
        zf.writestr(zipfile.ZipInfo("megatron/__init__.py", date_time=(2026, 12, 1, 0, 0, 0)), payload)
    return buf.getvalue()


def _upload(client: TestClient, headers: dict[str, str], body: bytes, filename: str = WHEEL):
    return client.post("/api/v1/artifacts", params={"filename": filename}, content=body,
                       headers={**headers, **OCTET})


def test_an_upload_is_stored_once_by_content(client: TestClient, make_token, db_session: Session) -> None:
    headers = make_token("submit", name="ci")
    body = _wheel()
    first = _upload(client, headers, body)
    assert first.status_code == 201, first.text
    art = first.json()
    sha = hashlib.sha256(body).hexdigest()
    assert art["sha256"] == sha and art["requirement"] == f"artifact:{sha}" and art["kind"] == "wheel"
    assert art["size_bytes"] == len(body) and art["uploaded_by"] == "ci"
    again = _upload(client, headers, body, filename="megatron_core-0.16.1-py3-none-any.whl")
    assert again.status_code == 200 and again.json()["filename"] == WHEEL  # the first name stays
    folder = get_settings().resolved_artifact_folder
    stored = [p for p in folder.rglob("*") if p.is_file()]
    assert stored == [folder / sha / WHEEL] and stored[0].read_bytes() == body
    assert client.get(f"/api/v1/artifacts/{sha}").json()["sha256"] == sha
    assert [a["sha256"] for a in client.get("/api/v1/artifacts", headers=headers).json()] == [sha]


def test_uploads_have_their_own_limit_far_above_the_json_one(
    client: TestClient, make_token, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = make_token("submit")
    big = _wheel(b"z" * (4 * MAX_BODY_BYTES))  # zip stores it uncompressed: far over 64 KiB
    assert len(big) > MAX_BODY_BYTES
    assert _upload(client, headers, big).status_code == 201
    monkeypatch.setenv("PARITY_ARTIFACT_MAX_BYTES", str(MAX_BODY_BYTES))
    get_settings.cache_clear()
    declared = _upload(client, headers, _wheel(b"w" * (4 * MAX_BODY_BYTES)))
    assert declared.status_code == 413 and str(MAX_BODY_BYTES) in declared.json()["detail"]

    def chunks():  # no Content-Length: the route stops writing once the limit is passed
        yield _wheel()[:4]
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b"y" * 4096

    streamed = client.post("/api/v1/artifacts", params={"filename": WHEEL}, content=chunks(),
                           headers={**headers, **OCTET})
    assert streamed.status_code == 413, streamed.text
    assert not any((get_settings().resolved_artifact_folder / ".incoming").iterdir())  # nothing left behind
    # the JSON routes keep theirs
    assert client.post("/api/v1/runs", content=b"{" + b" " * MAX_BODY_BYTES + b"}",
                       headers={**headers, "content-type": "application/json"}).status_code == 413


def test_bad_uploads_are_refused_naming_the_reason(client: TestClient, make_token) -> None:
    headers = make_token("submit")
    assert _upload(client, {}, _wheel()).status_code == 401
    assert _upload(client, make_token("read"), _wheel()).status_code == 403
    for name, field in (("../evil.whl", "filename"), ("notes.txt", "filename"), ("megatron.whl", "filename")):
        resp = _upload(client, headers, _wheel(), filename=name)
        assert resp.status_code == 422 and resp.json()["field"] == field, (name, resp.text)
    wrong = _upload(client, headers, b"not a zip at all")
    assert wrong.status_code == 422 and "file signature" in wrong.json()["detail"]
    sdist = _upload(client, headers, b"\x1f\x8b" + b"\0" * 20, filename="megatron_core-0.16.1.tar.gz")
    assert sdist.status_code == 201 and sdist.json()["kind"] == "sdist"


def test_artifact_lines_are_their_own_requirement_kind() -> None:
    sha = "ab" * 32
    assert normalize([f"artifact:{sha.upper()}", "einops==0.8.1"]) == [f"artifact:{sha}", "einops==0.8.1"]
    assert [requirement_kind(x) for x in (f"artifact:{sha}", "/opt/x.whl", "git+https://h/r@abcdef1", "a==1")] == [
        "artifact", "path", "git", "index"]
    with pytest.raises(RequirementError, match="artifact:<64 hex"):
        normalize(["artifact:1234"])


@pytest.mark.engine
def test_a_build_from_an_artifact_needs_it_stored_and_resolves_it_to_the_file(
    client: TestClient, make_token, db_session: Session
) -> None:
    headers = make_token("submit")
    missing = client.post("/api/v1/environments", json={"requirements": [f"artifact:{'0' * 64}"]}, headers=headers)
    assert missing.status_code == 422 and "never uploaded" in missing.json()["detail"], missing.text
    art = _upload(client, headers, _wheel()).json()
    env = client.post("/api/v1/environments", json={"requirements": [art["requirement"]]}, headers=headers)
    assert env.status_code == 201 and env.json()["requirements"] == [art["requirement"]], env.text
    again = client.post("/api/v1/environments", json={"requirements": [art["requirement"]]}, headers=headers)
    assert again.status_code == 200 and again.json()["name"] == env.json()["name"]
    path = resolve_lines(db_session, [art["requirement"], "einops==0.8.1"])
    assert path[0].endswith(f"/{art['sha256']}/{WHEEL}") and Path(path[0]).is_file() and path[1] == "einops==0.8.1"


@pytest.mark.engine
def test_unused_artifacts_are_pruned_unless_a_build_waits_for_them(
    client: TestClient, make_token, db_session: Session
) -> None:
    headers = make_token("submit")
    kept = _upload(client, headers, _wheel(b"kept")).json()
    gone = _upload(client, headers, _wheel(b"gone")).json()
    assert client.post("/api/v1/environments", json={"requirements": [kept["requirement"]]},
                       headers=headers).status_code == 201  # pending: its build still needs the file
    db_session.execute(update(Artifact).values(last_used_at=utcnow() - timedelta(days=60)))
    assert prune_artifacts(db_session, settings=get_settings()) == [gone["sha256"]]
    folder = get_settings().resolved_artifact_folder
    assert not (folder / gone["sha256"]).exists() and (folder / kept["sha256"]).exists()
    refused = client.post("/api/v1/environments", json={"requirements": [gone["requirement"]]}, headers=headers)
    assert refused.status_code == 422 and "retention" in refused.json()["detail"]
    # the same bytes uploaded again bring it back
    back = _upload(client, headers, _wheel(b"gone"))
    assert back.status_code == 201 and (folder / gone["sha256"]).is_dir()
    db_session.execute(update(Environment).values(state="failed"))
    state = db_session.scalar(select(Artifact.state).where(Artifact.sha256 == gone["sha256"]))
    assert state == "stored"
