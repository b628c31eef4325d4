"""A warm-pool worker: the submitit payload of one pool allocation; each of its tasks is one rank.

Each task imports torch, Megatron-Core and the harness once (`jobs.rank.attempt.preload`), then
waits for a work order in its folder (`jobs/pool_folder.py`). For an order it forks an *attempt
child* that runs exactly the payload a cold job would run (`run_attempt`, which itself forks a
fresh child per phase, or `run_rank_phase` under isolation "job"), so every document is the one a
cold run writes; the task itself never builds a model, opens a process group or starts a thread,
and returns to the same pristine state after every order. While the child runs, the task rewrites
its heartbeat every second (a task that stops beating is taken for dead or hung by the scheduler)
and watches for a cancel naming the order, on which it kills the child's process group.

Once imported, each task writes what it imported (`imported.rank<r>.json`: torch's and Megatron-Core's
versions, and on rank 0 what the harness detects in the build): a freshly built environment's first
worker is its import check (service/runs/import_check.py), so the build itself imports nothing. A task
that cannot import torch or Megatron-Core says why there and exits: no order is ever handed to it.

The task exits on a "stop" order, or on its own after `idle_s` (+ 60 s, at least BACKSTOP_MIN_S) without an
order (a backstop for a scheduler that went away; the scheduler shrinks the pool itself first).

Idle, the task looks for an order every POLL_S just after its last one (the next phase of a suite
comes quickly), then ever less often, down to every IDLE_POLL_MAX_S: an idle worker wakes a few
times a second and holds no CPU (tests/jobs/test_pool_worker_idle.py). The order file is on a shared
folder (Slurm nodes), where no file-change event reaches another node: a poll it stays.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.pool_folder import HEARTBEAT_S, POLL_S, PoolFolder, read_pool_file, write_atomic
from jobs.rank.attempt import preload, run_attempt
from jobs.rank.entry import _env_rank, run_rank_phase

PR_SET_PDEATHSIG = 1
IDLE_POLL_MAX_S = 0.25  # the longest an idle task waits between looks at its order file
IDLE_FAST_S = 1.0  # how long after an order it keeps looking every POLL_S
# the least a task waits idle before it exits on its own (the scheduler lets it go far sooner): a suite's
# resharded resume's worker waits out its suite's other checks for the one local slot (2 cores: 60-90 s)
BACKSTOP_MIN_S = 300.0


def idle_wait(idle_for: float) -> float:
    """Seconds to sleep before the next look, `idle_for` seconds after the last order: POLL_S, then doubling."""
    if idle_for < IDLE_FAST_S:
        return POLL_S
    return min(IDLE_POLL_MAX_S, POLL_S * 2 ** ((idle_for - IDLE_FAST_S) / IDLE_FAST_S + 1))
ENTRIES: dict[str, Callable[..., Any]] = {"attempt": run_attempt, "phase": run_rank_phase}


def serve(folder: str, idle_s: float) -> dict[str, Any]:
    """Serve orders in `folder` until a stop order or `idle_s` without one; returns what it served."""
    pool = PoolFolder(Path(folder))
    rank = _env_rank()
    beat = _Beat(pool, rank)
    info = _preload_beating(beat)
    imported = import_report(info, rank)
    write_atomic(pool.imported(rank), imported)
    if not imported["ok"]:
        beat("stopping", None, force=True)
        return {"served": [], "info": info, "import_failed": imported["error"]}
    served: list[str] = []
    last_work = time.monotonic()
    while True:
        order = pool.read_order()
        if order is not None and order.get("id") not in served[-1:]:
            if order.get("kind") == "stop":
                beat("stopping", order.get("id"), force=True)
                return {"served": served, "info": info}
            code = _run_order(pool, rank, order, beat)
            write_atomic(pool.done(rank), {"order": order["id"], "exit": code})
            served.append(str(order["id"]))
            last_work = time.monotonic()
            continue
        if idle_s and time.monotonic() - last_work > max(idle_s + 60, BACKSTOP_MIN_S):
            beat("stopping", None, force=True)
            return {"served": served, "info": info, "idle_exit": True}
        beat("idle", served[-1] if served else None)
        time.sleep(idle_wait(time.monotonic() - last_work))


# what a build must import for its phases to run at all (a module of the harness's PRELOAD that a release
# lacks is reported by the phase that needs it, as before)
REQUIRED_IMPORTS = ("torch", "megatron.core")


def import_report(info: dict[str, Any], rank: int) -> dict[str, Any]:
    """What this task imported: ok with the versions (and, on rank 0, the harness's capabilities), or the error."""
    failed = {name: error for name, error in (info.get("preload_failed") or {}).items() if name in REQUIRED_IMPORTS}
    if failed:
        return {"ok": False, "error": "; ".join(f"import {name}: {error}" for name, error in failed.items())[:2000]}
    torch, core = sys.modules["torch"], sys.modules["megatron.core"]
    out: dict[str, Any] = {"ok": True, "torch": str(getattr(torch, "__version__", "?"))[:100],
                           "megatron_core": str(getattr(core, "__version__", "?"))[:100]}
    if rank == 0:  # read, never called: the build's classes are inspected, nothing is started
        try:
            from jobs.rank.compat import capabilities

            out["capabilities"] = capabilities()
        except Exception as exc:  # noqa: BLE001 - a harness that cannot read the build still lets it run
            out["capabilities"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
    return out


def _preload_beating(beat: _Beat) -> dict[str, Any]:
    """The imports, with a thread beating "starting" meanwhile (an import under load takes tens of
    seconds: a silent task would read as hung). The thread is joined before any fork."""
    stop = threading.Event()

    def beating() -> None:
        while not stop.is_set():
            beat("starting", None, force=True)
            stop.wait(HEARTBEAT_S)

    thread = threading.Thread(target=beating, name="pool-start-beat", daemon=True)
    thread.start()
    try:
        return preload()
    finally:
        stop.set()
        thread.join()


class _Beat:
    """The task's heartbeat file, rewritten at most every HEARTBEAT_S unless the state changed."""

    def __init__(self, pool: PoolFolder, rank: int) -> None:
        self.pool, self.rank, self.last, self.state, self.since = pool, rank, float("-inf"), "", time.time()

    def __call__(self, state: str, order: str | None, force: bool = False) -> None:
        now = time.monotonic()
        if state != self.state:
            self.since = time.time()  # when this state began: the scheduler's idle clock
        if force or state != self.state or now - self.last >= HEARTBEAT_S:
            write_atomic(self.pool.heartbeat(self.rank),
                         {"state": state, "order": order, "pid": os.getpid(), "since": self.since})
            self.last, self.state = now, state


def _run_order(pool: PoolFolder, rank: int, order: dict[str, Any], beat: _Beat) -> int:
    """Fork the attempt child for `order`, beat while it runs, kill it on cancel; its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(rank, order)
    order_id = str(order["id"])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        beat("busy", order_id)
        if _cancel_of(pool) == order_id:
            _kill_group(pid)
        time.sleep(POLL_S)


def _cancel_of(pool: PoolFolder) -> str | None:
    found = read_pool_file(pool.cancel)
    return None if found is None else str(found.get("order"))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _child(rank: int, order: dict[str, Any]) -> None:
    """The attempt child: its own process group (one kill stops it and its phase children), dies with
    its task, logs to the attempt's own files, runs the payload, and leaves without the task's exit
    handlers."""
    code = 0
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        # the phase children run_attempt forks die with this child too (no orphan left holding a port)
        os.register_at_fork(after_in_child=_die_with_parent)
        # the attempt's own HOME, TMPDIR and caches (inside its folder), not the worker's: what one attempt
        # writes there is not the next one's
        env = order.get("env")
        if isinstance(env, dict):
            os.environ.update({str(k): str(v) for k, v in env.items()})
        logs = order.get("logs") or []
        if rank < len(logs):
            for fd, path in zip((1, 2), logs[rank], strict=True):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(out, fd)
                os.close(out)
        ENTRIES[order["entry"]](*order["args"])
    except BaseException:  # noqa: BLE001 - reported on the attempt's stderr; its documents say the rest
        code = 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
