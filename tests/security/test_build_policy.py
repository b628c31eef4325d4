"""Who may build what: a build runs the install code of every line it names.

submit tokens: only what PARITY_BUILD_ALLOW lists; the build scope: any line but local paths;
admin: local paths too, which the API never opens, stats or hashes (the build job does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.plugins.server import configure

SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "git+https://github.com/NVIDIA/Megatron-LM"


def _build(client: TestClient, headers: dict[str, str], *lines: str):
    return client.post("/api/v1/environments", headers=headers, json={"requirements": list(lines)})


@pytest.mark.parametrize("line", [
    "einops==0.8.1",                                   # any PyPI name: its setup.py runs in the build
    "megatron-core>=0",                                # not a pinned release
    "megatron-core==0.15.3; python_version>'3'",       # markers
    f"{REPO}@{SHA[:7]}",                               # a short sha names nothing for sure
    f"git+https://github.com/mallory/Megatron-LM@{SHA}",  # another repository
])
def test_a_submit_token_may_not_build_what_is_not_allow_listed(client: TestClient, make_token, line: str) -> None:
    resp = _build(client, make_token("submit"), "megatron-core==0.16.1", line)
    assert resp.status_code in (403, 422), resp.text
    if resp.status_code == 403:
        assert resp.json()["field"] == "requirements[1]" and "PARITY_BUILD_ALLOW" in resp.json()["detail"]


@pytest.mark.engine
def test_allow_listed_sources_build_with_a_submit_token(client: TestClient, make_token, monkeypatch) -> None:
    configure(monkeypatch, PARITY_BUILD_ALLOW=f"megatron-core, {REPO}.git, artifact")
    submit = make_token("submit")
    for line in ("megatron-core==0.15.3", f"{REPO}@{SHA}", f"{REPO}.git@{SHA}"):
        resp = _build(client, submit, line)
        assert resp.status_code == 201, (line, resp.text)
    # an artifact line passes the policy; that the bytes were uploaded is checked next
    resp = _build(client, submit, "artifact:" + "b" * 64)
    assert resp.status_code == 422 and resp.json()["error"] == "invalid_artifact", resp.text


@pytest.mark.engine
def test_artifacts_are_allow_listed_by_default_and_can_be_taken_off(
    client: TestClient, make_token, monkeypatch
) -> None:
    line = "artifact:" + "c" * 64
    assert _build(client, make_token("submit"), line).status_code == 422  # allowed; never uploaded
    configure(monkeypatch, PARITY_BUILD_ALLOW="megatron-core")
    resp = _build(client, make_token("submit"), line)
    assert resp.status_code == 403 and "PARITY_BUILD_ALLOW" in resp.json()["detail"]


@pytest.mark.engine
def test_the_build_scope_may_install_any_line_but_not_local_paths(client: TestClient, make_token) -> None:
    builder = make_token("submit", "build")
    assert _build(client, builder, "einops==0.8.1").status_code == 201
    assert _build(client, builder, f"git+https://example.org/any/repo@{SHA[:10]}").status_code == 201
    local = _build(client, builder, "/srv/src/megatron")
    assert local.status_code == 403 and "admin" in local.json()["detail"]


@pytest.mark.engine
def test_local_paths_never_reveal_whether_they_exist(client: TestClient, make_token, tmp_path: Path) -> None:
    submit = make_token("submit")
    real, missing = _build(client, submit, "/etc/shadow"), _build(client, submit, "/no/such/file.whl")
    assert real.status_code == missing.status_code == 403
    assert real.json()["detail"].replace("[0]", "") == missing.json()["detail"].replace("[0]", "")
    assert "wheel" not in real.text and "exist" not in real.text
    # an admin's local path is queued without the API touching it: the build job checks and hashes it
    admin = make_token("admin")
    queued = _build(client, admin, str(tmp_path / "not-there-yet"))
    assert queued.status_code == 201 and queued.json()["state"] == "pending", queued.text
    again = _build(client, admin, str(tmp_path / "not-there-yet"))
    assert again.status_code == 201 and again.json()["id"] != queued.json()["id"]  # never a stale reuse
