"""Helpers for tests that run the real scheduler (and API) as separate processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from jobs.pool_folder import PoolFolder
from models import Phase, PhaseEvent, Run
from service.core.check_spec import run_spec_of
from service.core.db import session_scope
from service.core.settings import get_settings
from service.environments.registry import (
    DEFAULT_ENVIRONMENT,
    create_environment,
    ensure_default_environment,
    get_environment,
)
from service.runs.records import create_run
from service.suites.definitions import SuiteCheck, apply_suite
from service.suites.runs import create_suite_run

PARITY = [sys.executable, "-m", "service.cli.main"]
GOOD = ["match-groups-by-lr-bounds", "realign-param-index", "restore-adam-step"]


def slurm_now() -> str:
    """The current time in the form sacct -S takes (run ids repeat across test sessions; times don't)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def run_to_end(env: dict[str, str], run_id: int, log: Path, timeout: float) -> Run:
    """Run one scheduler until run_id has finished, stop it, and return the run's row."""
    scheduler = start(["scheduler"], env, log)
    try:
        wait_for(lambda: run_row(run_id).finished_at, timeout, "the run to end", alive=[scheduler])
    finally:
        stop(scheduler)
    jobs_gone(run_id)
    return run_row(run_id)


def jobs_gone(run_id: int, timeout: float = 60) -> None:
    """Wait until the run's Slurm jobs have left the queue.

    A verdict is read from the documents on disk, so a job can still be exiting when its run has
    ended; the next test (run ids restart per test) must not find it under the same job name.
    """
    ids = {p.job_id for p in phases(run_id) if p.job_id and p.executor == "slurm"}
    if ids:
        wait_for(lambda: not ids & set(_squeue_ids()), timeout, f"the jobs of run {run_id} to leave the queue")


def _squeue_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=False)
    return out.stdout.split()


def free_port() -> int:
    """A port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_up(url: str) -> bool:
    """Whether a `parity serve` at url answers its health check."""
    try:
        # livez: the liveness that stays open when reads need a token (healthz is behind it then)
        return httpx.get(f"{url}/api/v1/livez", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def service_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a scheduler/API subprocess: the test database and run folder."""
    env = dict(os.environ)
    env.update(
        {"PARITY_SCHEDULER_POLL_SECONDS": "0.5", "PARITY_RETRY_BACKOFF_SECONDS": "0",
         "PARITY_RUN_FOLDER": str(tmp_path / "runs"), **extra}
    )
    return env


def start(args: list[str], env: dict[str, str], log: Path, command: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start a `parity` subcommand (or `command`: a test's own entry point) with its output in log."""
    handle = open(log, "ab")
    return subprocess.Popen([*(command or PARITY), *args], env=env, stdout=handle, stderr=handle,
                            start_new_session=True)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal a process and wait for it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=60)


def register_environment(name: str, python: str) -> str:
    """Register an environment (committed) and return its name."""
    with session_scope() as session:
        create_environment(session, name=name, python=python)
    return name


def queue(spec: dict[str, Any], labels: dict[str, str] | None = None, environment: str | None = None) -> int:
    """Queue a run directly through the service layer (committed) and return its id."""
    with session_scope() as session:
        if environment:
            env = get_environment(session, name=environment)
        else:
            env = ensure_default_environment(session, settings=get_settings())
        run, _ = create_run(session, spec=run_spec_of(spec), environment=env, labels=labels or {}, requester="t")
        return run.id


def queue_suite(name: str, checks: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Apply a suite of these checks and queue one suite run of it on the default environment (committed);
    {check name: run id}."""
    with session_scope() as session:
        apply_suite(session, name=name, checks=[SuiteCheck.model_validate({"name": n, "spec": spec})
                                                for n, spec in checks.items()])
    with session_scope() as session:
        suite_run, _ = create_suite_run(session, suite_name=name, version=None, environment=DEFAULT_ENVIRONMENT,
                                        labels={}, requester="t", settings=get_settings())
        return {str(r["name"]): int(r["run_id"]) for r in suite_run.runs}


def live_workers(runs: Path) -> list[PoolFolder]:
    """The warm-pool workers under a run folder not (yet) retired."""
    root = runs / "pool"
    folders = [PoolFolder(p) for p in sorted(root.iterdir())] if root.is_dir() else []
    return [w for w in folders if w.record.exists() and not w.retired.exists()]


def run_row(run_id: int) -> Run:
    """A fresh copy of the run row."""
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
        return run


def phases(run_id: int) -> list[Phase]:
    """All phase rows of a run, oldest first."""
    with session_scope() as session:
        rows = list(session.scalars(select(Phase).where(Phase.run_id == run_id).order_by(Phase.id)))
        for row in rows:
            session.expunge(row)
        return rows


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.5,
    alive: list[subprocess.Popen[bytes]] | None = None,
) -> Any:
    """Poll predicate until it returns something truthy; fail with `what` after timeout or if a
    process in `alive` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in alive or []:
            assert proc.poll() is None, f"{proc.args!r} exited with {proc.returncode} while waiting for {what}"
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def sacct_jobs(name: str, since: str) -> list[str]:
    """Job ids Slurm accounting knows under a job name, submitted since `since` from this checkout
    (allocations only). The Slurm is shared and run ids repeat across test sessions, so another
    checkout's job may carry the same name: the submitting directory tells them apart."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", f"--name={name}", "-o", "JobID,WorkDir", "-S", since],
        capture_output=True, text=True, check=True,
    )
    here = os.getcwd()
    rows = [line.split("|", 1) for line in out.stdout.splitlines() if line.strip()]
    return [job for job, work_dir in rows if work_dir == here]


def queued_jobs(name: str) -> list[str]:
    """Job ids in the Slurm queue under a job name."""
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def phase_moves(run_id: int) -> list[tuple[str | None, str]]:
    """Every recorded phase state change of a run, oldest first."""
    with session_scope() as session:
        return list(session.execute(
            select(PhaseEvent.from_state, PhaseEvent.to_state).where(PhaseEvent.run_id == run_id)
            .order_by(PhaseEvent.id)
        ).tuples())


def job_name(phase: Phase) -> str:
    """The Slurm job name the scheduler gives a phase attempt (with this test's settings)."""
    from service.scheduler.submitter import job_name as name_of

    return name_of(get_settings(), phase)
