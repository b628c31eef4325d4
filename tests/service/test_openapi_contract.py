"""The OpenAPI document is true: schemathesis-generated requests against a live `parity serve` never
get a 500, an undocumented status or content type, or a body that breaks the documented schema."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.core.state_names import MAX_WAIT_S
from tests.plugins.scheduler_harness import PARITY, api_up, free_port, service_env, start, stop, wait_for

pytestmark = pytest.mark.timeout(900)  # past the 300 s ceiling: 52 s alone, a loaded host several times that

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
# A long poll (GET /runs/{id}/wait, /suite-runs/{id}/wait) may rightly hold a request for its documented
# longest wait; schemathesis's default 10 s would call that a network error (the nightly's red run, once
# the stateful phase had made a run to wait on), so every request gets the longest wait and a margin.
REQUEST_TIMEOUT_S = MAX_WAIT_S + 15
# Generated long polls that wait their whole timeout_s for a change that never comes (up to MAX_WAIT_S
# each) took the pass from 90 s to 524 s and test nothing more: a wait answers the same document early or
# late. Their timeout_s is pinned short; what a wait answers and when is tests/service/test_waiting.py's.
CONFIG = '''[parameters]
"query.timeout_s" = 0.5
'''


@pytest.mark.nightly
@pytest.mark.slow
def test_api_matches_its_openapi_document(committed_db: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path, PARITY_EXECUTOR="local")
    token = subprocess.run([*PARITY, "token", "create", "--name", "contract", "--scope", "admin"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    api = start(["serve", "--port", str(port)], env, tmp_path / "api.log")
    try:
        wait_for(lambda: api_up(url), 60, "the API", alive=[api])
        cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        done = subprocess.run(
            [cli, "--config-file", str(config), "run", f"{url}/openapi.json", "-H", f"Authorization: Bearer {token}",
             "--max-examples", "25", "--checks", CHECKS, "--seed", "1", "--request-timeout", str(REQUEST_TIMEOUT_S)],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,  # its cache stays out of the repo
        )
        assert done.returncode == 0, done.stdout[-4000:]
    finally:
        stop(api)

