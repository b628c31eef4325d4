"""`parity submit` never reports an auth or transport problem as a parity failure (exit 1): it exits 2."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.plugins.scheduler_harness import free_port
from tests.plugins.server import configure, serve


def _submit(url: str, token: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli.main", "submit", "--config", "dense-bf16", "--dp", "1", "--steps", "6",
         "--save-step", "3", "--url", url, "--token", token, *extra],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )


def test_a_submit_only_token_with_reads_behind_a_token_exits_2(committed_db: str, monkeypatch, tokens) -> None:
    configure(monkeypatch, PARITY_READS_REQUIRE_TOKEN="1")
    submit_only = tokens("ci", "submit")
    with serve() as url:
        done = _submit(url, submit_only, "--wait", "--timeout", "60")
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "403" in done.stderr and "Traceback" not in done.stderr


def test_a_bad_token_or_no_service_exits_2(committed_db: str, monkeypatch, tokens) -> None:
    configure(monkeypatch)
    with serve() as url:
        assert _submit(url, "prt_not-a-token", "--wait").returncode == 2
    assert _submit(f"http://127.0.0.1:{free_port()}", "prt_x", "--wait").returncode == 2
