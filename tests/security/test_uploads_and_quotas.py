"""Uploads and per-token quotas: the review's 1.2 GB unauthenticated upload and unbounded storage, refused.

The upload's token is checked before a byte of its body is read (whatever its content type), a chunked
body is stopped at the limit while it streams, and each token may keep only so many artifacts and
bytes stored and so many builds under way (a 429 `quota_exceeded` naming the setting).
"""

from __future__ import annotations

import io
import select
import socket
import zipfile
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from service.core.settings import get_settings
from tests.plugins.server import configure, serve

WHEEL = "megatron_core-0.16.1-py3-none-any.whl"
OCTET = {"content-type": "application/octet-stream"}
CHUNK = 64 * 1024


def _wheel(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # stored, not compressed: the wheel is as large as its payload
        zf.writestr(zipfile.ZipInfo("megatron/__init__.py", date_time=(2026, 12, 1, 0, 0, 0)), payload)
    return buf.getvalue()


def _open_chunked(base: str, headers: dict[str, str]) -> socket.socket:
    """A connection that has sent an upload's headers (chunked: no declared length) and no body yet."""
    url = urlsplit(base)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    lines = [f"POST /api/v1/artifacts?filename={WHEEL} HTTP/1.1", f"Host: {url.netloc}",
             "Transfer-Encoding: chunked", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _status(sock: socket.socket, wait_s: float) -> int | None:
    """The response's status code if one arrives within wait_s, else None."""
    ready, _, _ = select.select([sock], [], [], wait_s)
    if not ready:
        return None
    head = sock.recv(4096)
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else None


@pytest.mark.parametrize("content_type", ["application/octet-stream", "application/json"])
def test_an_upload_without_a_token_is_refused_before_its_body_is_read(
    committed_db: str, content_type: str
) -> None:
    """The headers alone get the 401: the server does not wait for (or buffer) a single body byte."""
    with serve() as base:
        sock = _open_chunked(base, {"Content-Type": content_type})
        try:
            assert _status(sock, 10) == 401
        finally:
            sock.close()


def test_a_chunked_upload_is_stopped_at_the_limit_while_it_streams(
    committed_db: str, tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No declared length: the 413 comes once the limit is passed, not after the client sent everything."""
    limit = 1 << 20
    configure(monkeypatch, PARITY_ARTIFACT_MAX_BYTES=str(limit))
    secret = tokens("ci", "submit")
    with serve() as base:
        sock = _open_chunked(base, {"Authorization": f"Bearer {secret}", **OCTET})
        sent, status = 0, None
        try:
            body = b"PK\x03\x04" + b"z" * (CHUNK - 4)
            while sent < 256 * limit and status is None:  # a client that would send 256 MiB
                try:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(body), body))
                except OSError:
                    status = _status(sock, 10)  # the server answered and closed while we were sending
                    break
                sent += len(body)
                status = _status(sock, 0)
        finally:
            sock.close()
    assert status == 413
    # the answer came near the limit (what the socket buffers hold on top), long before the end
    assert sent < 32 * limit, sent
    incoming = get_settings().resolved_artifact_folder / ".incoming"
    assert not incoming.exists() or not any(incoming.iterdir())


def _upload(client: TestClient, headers: dict[str, str], body: bytes):
    return client.post("/api/v1/artifacts", params={"filename": WHEEL}, content=body, headers={**headers, **OCTET})


def test_a_token_may_keep_only_so_many_artifacts(
    client: TestClient, make_token, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, PARITY_TOKEN_MAX_ARTIFACTS="2")
    ci, other = make_token("submit", name="ci"), make_token("submit", name="other")
    first = _upload(client, ci, _wheel(b"1"))
    assert first.status_code == 201 and _upload(client, ci, _wheel(b"2")).status_code == 201
    third = _upload(client, ci, _wheel(b"3"))
    assert third.status_code == 429, third.text
    assert third.json()["error"] == "quota_exceeded" and "PARITY_TOKEN_MAX_ARTIFACTS=2" in third.json()["detail"]
    assert third.json()["field"] == "body"
    assert _upload(client, ci, _wheel(b"1")).status_code == 200  # bytes already stored cost nothing
    assert _upload(client, other, _wheel(b"3")).status_code == 201  # the quota is the token's
    assert _upload(client, make_token("admin"), _wheel(b"4")).status_code == 201  # admins have none


def test_a_token_may_keep_only_so_many_bytes_and_an_upload_past_them_stops_there(
    client: TestClient, make_token, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, PARITY_TOKEN_MAX_ARTIFACT_BYTES="1M")
    ci = make_token("submit", name="ci")
    assert _upload(client, ci, _wheel(b"a" * 600_000)).status_code == 201
    over = _upload(client, ci, _wheel(b"b" * 600_000))
    assert over.status_code == 429, over.text
    assert "PARITY_TOKEN_MAX_ARTIFACT_BYTES=1M" in over.json()["detail"]
    assert _upload(client, ci, _wheel(b"c" * 100_000)).status_code == 201  # what is left still fits
    incoming = get_settings().resolved_artifact_folder / ".incoming"
    assert not any(incoming.iterdir())


@pytest.mark.engine
def test_a_token_may_have_only_so_many_builds_under_way(
    client: TestClient, make_token, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, PARITY_TOKEN_MAX_BUILDS="1")
    ci, other = make_token("submit", name="ci"), make_token("submit", name="other")
    lines = [_upload(client, ci, _wheel(bytes([i]))).json()["requirement"] for i in range(3)]

    def build(headers: dict[str, str], line: str):
        return client.post("/api/v1/environments", json={"requirements": [line]}, headers=headers)

    assert build(ci, lines[0]).status_code == 201
    refused = build(ci, lines[1])
    assert refused.status_code == 429 and refused.json()["field"] == "requirements", refused.text
    assert "PARITY_TOKEN_MAX_BUILDS=1" in refused.json()["detail"]
    assert build(ci, lines[0]).status_code == 200  # the same build again starts nothing
    assert build(other, lines[1]).status_code == 201


def test_a_quota_setting_that_is_not_a_size_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_TOKEN_MAX_ARTIFACT_BYTES", "lots")
    get_settings.cache_clear()
    try:
        with pytest.raises(ValueError, match="PARITY_TOKEN_MAX_ARTIFACT_BYTES: 'lots' is not a size"):
            get_settings()
    finally:
        monkeypatch.delenv("PARITY_TOKEN_MAX_ARTIFACT_BYTES")
        get_settings.cache_clear()


def test_a_job_may_neither_list_the_uploads_nor_read_one(
    client: TestClient, make_token, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The review's jobs listed artifacts/ and read every tenant's wheel: the folder is passable, not listable, and
    a stored wheel is the service's only (a build installs a copy in its own folder: test_names_and_state.py)."""
    import os
    import pwd
    import shutil
    import subprocess
    import uuid
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.skip("needs root to act as the job user")
    try:
        job = pwd.getpwnam("parity-job")
    except KeyError:
        pytest.skip("no user parity-job: run scripts/job-user.sh")
    base = Path("/var/tmp") / f"parity-artifacts-{uuid.uuid4().hex[:8]}"  # /tmp/pytest-of-root is 0700
    base.mkdir(mode=0o755)
    try:
        configure(monkeypatch, PARITY_ARTIFACT_FOLDER=str(base / "artifacts"))
        art = _upload(client, make_token("submit"), _wheel(b"mine")).json()
        wheel = base / "artifacts" / art["sha256"] / WHEEL
        as_job = ["setpriv", f"--reuid={job.pw_uid}", f"--regid={job.pw_gid}", "--clear-groups", "--"]
        listing = subprocess.run([*as_job, "ls", str(base / "artifacts")], capture_output=True, text=True)
        assert listing.returncode != 0 and art["sha256"] not in listing.stdout, listing.stdout
        read = subprocess.run([*as_job, "cat", str(wheel)], capture_output=True)
        assert read.returncode != 0 and read.stdout == b"" and wheel.read_bytes(), read
    finally:
        shutil.rmtree(base, ignore_errors=True)
