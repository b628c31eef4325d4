"""Environments over the API: registration checks of `python`, build requests reused by content hash."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.environments.requirements import content_hash, local_source_digest, normalize

PY = sys.executable
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


@pytest.mark.parametrize(
    ("python", "why"),
    [
        ("python", "absolute path"),
        ("/usr/bin/python3 -c 'import os'", "absolute path"),
        ("/tmp/x;rm -rf /", "absolute path"),
        ("/nowhere/bin/python", "not an existing executable"),
        ("/etc/passwd", "not an existing executable"),
        ("/bin/false", "cannot import torch and megatron.core"),
        ("/" + "a" * 1100, "string_too_long"),
    ],
)
def test_registered_python_is_checked(client: TestClient, make_token, python: str, why: str) -> None:
    resp = client.post("/api/v1/environments", json={"name": "x", "python": python}, headers=make_token("admin"))
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["field"] == "python" and why in str(body), body


@pytest.mark.megatron
def test_registered_python_records_torch_and_megatron_versions(client: TestClient, make_token) -> None:
    resp = client.post("/api/v1/environments", json={"name": "mine", "python": PY}, headers=make_token("admin"))
    assert resp.status_code == 201, resp.text
    env = resp.json()
    assert env["state"] == "ready"
    assert env["packages"]["megatron_core"] == env["megatron_core"] == "0.16.1"
    assert env["torch"].startswith("2.13.0")


@pytest.mark.engine
def test_registering_a_python_needs_admin_a_build_needs_submit(client: TestClient, make_token) -> None:
    submit = make_token("submit")
    assert client.post("/api/v1/environments", json={"name": "x", "python": PY}, headers=submit).status_code == 403
    resp = client.post("/api/v1/environments", json={"requirements": ["megatron-core==0.15.3"]}, headers=submit)
    assert resp.status_code == 201, resp.text
    assert client.post("/api/v1/environments", json={"requirements": ["megatron-core==0.15.3"]}).status_code == 401


@pytest.mark.engine
def test_identical_requirement_sets_reuse_one_build(client: TestClient, make_token) -> None:
    headers = make_token("submit", "build")  # einops is not in PARITY_BUILD_ALLOW: the build scope may install it
    first = client.post("/api/v1/environments", json={"requirements": ["megatron-core==0.15.3", "einops==0.8.1"]},
                        headers=headers)
    assert first.status_code == 201
    env = first.json()
    assert env["state"] == "pending" and env["name"].startswith("build-") and env["content_hash"]
    assert env["requirements"] == ["einops==0.8.1", "megatron-core==0.15.3"]
    again = client.post("/api/v1/environments", json={"requirements": [" einops==0.8.1", "megatron-core==0.15.3"]},
                        headers=headers)
    assert again.status_code == 200 and again.json()["id"] == env["id"]
    other = client.post("/api/v1/environments", json={"requirements": ["megatron-core==0.16.1"]}, headers=headers)
    assert other.status_code == 201 and other.json()["id"] != env["id"]
    # a run may be queued on it at once; it waits for the build
    run = client.post("/api/v1/runs", json={"spec": SPEC, "environment": env["name"]}, headers=headers)
    assert run.status_code == 202 and run.json()["state"] == "queued"
    named = client.post("/api/v1/environments", json={"requirements": ["megatron-core==0.15.3", "einops==0.8.1"],
                                                      "name": "other-name"}, headers=headers)
    assert named.status_code == 409 and named.json()["field"] == "name"


@pytest.mark.parametrize(
    ("lines", "field", "why"),
    [
        (["--index-url https://evil.example/simple"], "requirements[0]", "pip options"),
        (["megatron-core==0.15.3", "-e /tmp"], "requirements[1]", "pip options"),
        (["megatron-core=0.15.3"], "requirements[0]", "not a valid requirement"),
        (["git+https://github.com/NVIDIA/Megatron-LM@main"], "requirements[0]", "commit sha"),
        (["/no/../etc/shadow"], "requirements[0]", "without whitespace or '..'"),
        (["https://example.com/x.whl"], "requirements[0]", "not a valid requirement"),
        (["megatron-core @ https://example.com/x.whl"], "requirements[0]", "direct URLs"),
    ],
)
def test_bad_requirement_lines_name_the_line(client: TestClient, make_token, lines, field, why) -> None:
    resp = client.post("/api/v1/environments", json={"requirements": lines}, headers=make_token("submit"))
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == field and why in resp.json()["detail"], resp.json()


def test_exactly_one_of_python_or_requirements(client: TestClient, make_token) -> None:
    headers = make_token("admin")
    both = client.post("/api/v1/environments", json={"name": "x", "python": PY, "requirements": ["a==1"]},
                       headers=headers)
    assert both.status_code == 422
    neither = client.post("/api/v1/environments", json={"name": "x"}, headers=headers)
    assert neither.status_code == 422
    too_many = client.post("/api/v1/environments", json={"requirements": [f"p{i}==1" for i in range(33)]},
                           headers=headers)
    assert too_many.status_code == 422


def test_local_source_is_hashed_by_content_in_the_build_job(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pyproject.toml").write_text("[project]\nname='pkg'\nversion='1'\n")
    (src / "pkg" / "__init__.py").write_text("X = 1\n")
    before = local_source_digest(src)
    (src / "pkg" / "__pycache__").mkdir()
    (src / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    (src / "pkg.egg-info").mkdir()  # what a pip build leaves in the tree
    (src / "pkg.egg-info" / "PKG-INFO").write_text("Name: pkg\n")
    assert local_source_digest(src) == before
    (src / "pkg" / "__init__.py").write_text("X = 2\n")
    assert local_source_digest(src) != before
    with pytest.raises(ValueError, match="no pyproject.toml"):
        local_source_digest(src / "pkg")
    # the API never reads the tree: a set with a local path is a new build each time
    first = content_hash([str(src)], torch_version="2.13.0", python_version="3.11")
    assert content_hash([str(src)], torch_version="2.13.0", python_version="3.11") != first
    assert normalize([str(tmp_path / "does-not-exist")]) == [str(tmp_path / "does-not-exist")]
