"""An idle warm-pool worker holds no CPU: it waits for an order without spinning, and still takes one.

A real worker task (`jobs.launch.pool_worker.serve`, torch and Megatron-Core imported) in its own
process, driven through its folder exactly as the scheduler drives it (jobs/pool_folder.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from jobs.pool_folder import PoolFolder, read_pool_file

ROOT = Path(__file__).resolve().parents[2]
IDLE_WINDOW_S = 4.0
# generous: the host is shared with other test sessions (polling every 50 ms measured 0.5% of a core here;
# CPU time comes in 10 ms ticks, so the wake-ups below are the sharper measure)
MAX_IDLE_CPU_FRACTION = 0.01
# each look at the order file is a sleep and a wake-up of the task's thread: every 50 ms was 20 a second
MAX_WAKEUPS_PER_S = 8


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"the worker exited ({proc.returncode}) waiting for {what}")
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout_s:.0f} s")


def _state(pool: PoolFolder) -> str | None:
    beat = read_pool_file(pool.heartbeat(0))
    return None if beat is None else beat.get("state")


def _idle_for(pool: PoolFolder, seconds: float) -> bool:
    beat = read_pool_file(pool.heartbeat(0))
    return beat is not None and beat.get("state") == "idle" and time.time() - float(beat["since"]) >= seconds


@pytest.mark.slow  # one torch + Megatron-Core import (~10-30 s on a loaded host)
def test_an_idle_worker_uses_no_cpu_and_still_takes_an_order(tmp_path: Path) -> None:
    pool = PoolFolder(tmp_path / "worker")
    pool.folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SUBMITIT_LOCAL_GLOBALID", None)
    code = f"import json; from jobs.launch.pool_worker import serve; print(json.dumps(serve({str(pool.folder)!r}, 0)))"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        # idle for a while: past the imports' tail (threads winding down), into the idle loop proper
        _wait(lambda: _idle_for(pool, 2.0), 300, "an idle heartbeat", proc)
        worker = psutil.Process(proc.pid)
        before, switches, t0 = worker.cpu_times(), worker.num_ctx_switches().voluntary, time.monotonic()
        time.sleep(IDLE_WINDOW_S)  # the window measured, not a wait for something to happen
        after, elapsed = worker.cpu_times(), time.monotonic() - t0
        used = (after.user + after.system) - (before.user + before.system)
        wakeups = (worker.num_ctx_switches().voluntary - switches) / elapsed
        assert used / elapsed < MAX_IDLE_CPU_FRACTION, f"idle worker used {used:.3f} s of CPU in {elapsed:.1f} s"
        assert wakeups < MAX_WAKEUPS_PER_S, f"idle worker woke {wakeups:.1f} times a second"
        # still alive and beating while idle (the scheduler takes a silent task for dead)
        age = pool.beat_age(0)
        assert age is not None and age < 3.0
        # and an order placed now is still taken: the stop order ends it
        assert pool.place_order({"id": "stop-1", "kind": "stop"})
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert json.loads(out.decode().strip().splitlines()[-1])["served"] == []
        assert _state(pool) == "stopping"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
