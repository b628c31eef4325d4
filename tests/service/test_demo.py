"""The README's main command: `parity demo` on embedded defaults ends in verdicts and dashboard URLs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.megatron, pytest.mark.timeout(600)]  # past the 300 s ceiling: real builds or many runs


def test_demo_on_embedded_defaults_ends_in_verdicts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARITY_")}
    env.update(PARITY_DATA_DIR=str(tmp_path / "data"), PARITY_EXECUTOR="local", PARITY_API_PORT="0")
    done = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "demo", "--steps", "8", "--save-step", "4"],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,  # not a terminal: exits
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "verdict: pass" in out
    assert "verdict: fail" in out and "optimizer-index-misalignment" in out
    assert "REGRESSION" not in out  # with and without workarounds are two checks: never compared
    assert "/runs/2/triage" in out and "dashboard: http://127.0.0.1:" in out
    assert "verdict: pass (worked around: " in out  # the one label, also here
    assert "why: " in out and "the resume never ran" in out  # the known-bad crash, in a sentence
    assert "these URLs with it" in out  # says the dashboard ends with the demo
    assert (tmp_path / "data" / "pgdata" / "PG_VERSION").exists()  # the embedded server was used
    assert "/runs/1/triage" not in out  # the passing run has nothing to triage
    assert "embedded Postgres stopped" in out and not (tmp_path / "data" / "pgdata" / "postmaster.pid").exists()


def test_the_known_good_run_takes_the_configs_own_workarounds() -> None:
    from service.cli.server.demo import known_good_workarounds

    # Bug A and the Adam step on the default MoE config; 0.16.1's group collision on every GPT config (each has
    # a decoupled LR for its embedding); no Bug A on dense
    assert known_good_workarounds("moe-fp32-router") == ["match-groups-by-lr-bounds", "realign-param-index",
                                                         "restore-adam-step"]
    assert known_good_workarounds("gpt-recipe") == ["restore-adam-step", "match-groups-by-lr-bounds"]
    assert known_good_workarounds("dense-bf16") == ["match-groups-by-lr-bounds", "restore-adam-step"]
