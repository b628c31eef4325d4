"""The base install is the client (no torch, Megatron-Core, submitit, SQLAlchemy, FastAPI) and drives a real service."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.plugins.client_venv import HEAVY, ClientVenv
from tests.plugins.scheduler_harness import PARITY, api_up, free_port, service_env, start, stop, wait_for

pytestmark = pytest.mark.timeout(900)  # past the 300 s ceiling: real builds or many real runs


@pytest.mark.nightly
@pytest.mark.slow
def test_the_base_install_is_a_client_that_drives_a_real_service(
    committed_db: str, tmp_path: Path, base_client: ClientVenv
) -> None:
    client = base_client
    python = str(client.bin / "python")
    found = subprocess.run([python, "-c", "import importlib.util as u, json, sys; "
                            f"print(json.dumps([m for m in {list(HEAVY)!r} if u.find_spec(m)]))"],
                           capture_output=True, text=True, check=True)
    assert json.loads(found.stdout) == []
    parity = [str(client.bin / "parity")]
    # a command that needs an extra says which one
    serve = subprocess.run([*parity, "serve"], capture_output=True, text=True)
    assert serve.returncode == 2 and "needs the [service] extra" in serve.stderr, serve.stderr
    local = subprocess.run([*parity, "run-local", "--config", "dense-bf16", "--dp", "1", "--steps", "4",
                            "--save-step", "2"], capture_output=True, text=True)
    assert local.returncode == 2 and "needs the [engine] extra" in local.stderr, local.stderr

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_PUBLIC_URL=url, PARITY_EXECUTOR="local")
    tokens = {scope: subprocess.run([*PARITY, "token", "create", "--name", f"ci-{scope}", "--scope", scope,
                                     "--track", "*"],
                                    env=env, capture_output=True, text=True, check=True).stdout.strip()
              for scope in ("admin", "submit")}
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        client_env = {"PATH": f"{client.bin}:/usr/bin:/bin", "PARITY_SERVICE_URL": url, "HOME": str(tmp_path)}
        suite = tmp_path / "small.yaml"
        suite.write_text(yaml.safe_dump({"name": "small", "checks": [
            {"name": "dense", "spec": {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}}]}))
        applied = subprocess.run([*parity, "suite", "apply", str(suite), "--token", tokens["admin"]],
                                 env=client_env, capture_output=True, text=True)
        assert applied.returncode == 0 and "version 1 (new)" in applied.stdout, applied.stderr
        wheel = tmp_path / "megatron_core-0.16.1+t-py3-none-any.whl"
        wheel.write_bytes(b"PK\x03\x04" + b"\0" * 100)
        queued = subprocess.run(
            [*parity, "submit", "--suite", "small", "--wheel", str(wheel), "--label", "commit=abc"],
            env={**client_env, "PARITY_TOKEN": tokens["submit"]}, capture_output=True, text=True)
        assert queued.returncode == 0, queued.stdout + queued.stderr
        assert "suite run" in queued.stdout and "/suite-runs/" in queued.stdout and "artifact" in queued.stderr
        single = subprocess.run(  # one check on the same upload: stored once, the same build reused
            [*parity, "submit", "--config", "dense-bf16", "--dp", "1", "--steps", "4", "--save-step", "2",
             "--wheel", str(wheel)], env={**client_env, "PARITY_TOKEN": tokens["submit"]}, capture_output=True,
            text=True)
        assert single.returncode == 0 and "already stored" in single.stderr and "(reused)" in single.stderr, (
            single.stdout + single.stderr)
        listed = subprocess.run([*parity, "env", "list"], env=client_env, capture_output=True, text=True)
        assert listed.returncode == 0 and "artifact:" in listed.stdout, listed.stdout + listed.stderr
        runs = httpx.get(f"{url}/api/v1/runs", params={"label": "suite=small"}).json()["items"]
        assert len(runs) == 1 and runs[0]["labels"]["commit"] == "abc"
        built = httpx.get(f"{url}/api/v1/runs", params={"limit": 5}).json()["items"]
        assert len({r["environment"] for r in built}) == 1 and len(built) == 2
    finally:
        stop(api)
