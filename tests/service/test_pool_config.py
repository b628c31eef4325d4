"""PARITY_POOL's grammar and the worker folder's hand-off, both sides of each defence.

No Slurm, no Megatron: the parse errors name the entry, the field and what is allowed; an order is
placed exclusively (a second placement on a busy worker fails); what a worker writes is read as
bounded JSON (a link, a FIFO, an oversized or non-object file reads as nothing); a warm attempt is
an infrastructure failure when its worker stops beating or its job ended, and running otherwise.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.pool_folder import MAX_POOL_FILE_BYTES, PoolFolder, read_pool_file, write_atomic
from service.core.pool_config import PoolConfigError, PoolEntry, entry_for, parse_pool
from service.core.settings import Settings
from service.executors import pool
from service.executors.launcher import JobStatus


def test_a_pool_parses_with_defaults_and_an_env_of_its_own_before_the_star() -> None:
    entries = parse_pool("env=mcore-0.16:size=2:tasks=2:idle=300; env=*:tasks=4")
    assert entries == (PoolEntry("mcore-0.16", 2, 2, 300.0, 30.0), PoolEntry("*", 4, 1, 300.0, 30.0))
    assert entry_for(entries, "mcore-0.16", 2) == entries[0]
    assert entry_for(entries, "other", 4) == entries[1]
    assert entry_for(entries, "other", 2) is None  # no entry for that world size: cold
    assert parse_pool("") == () and parse_pool(" ; ") == ()


@pytest.mark.parametrize(("text", "names"), [
    ("env=a:tasks=2:speed=3", ["'speed=3'", "env=, size=, tasks=, idle=, hang="]),
    ("env=a:size=2", ["tasks= is required"]),
    ("tasks=2", ["env= is required"]),
    ("env=a:tasks=2:size=0", ["size must be a whole number from 1 to 64", "'0'"]),
    ("env=a:tasks=2:size=99999999999999999999999", ["size must be a whole number from 1 to 64"]),
    ("env=a:tasks=two", ["tasks must be a whole number from 1 to 1024"]),
    ("env=a:tasks=2:idle=-1", ["idle must be a whole number from 0 to 86400"]),
    ("env=a:tasks=2:hang=1", ["hang must be a whole number from 3 to 3600"]),
    ("env=a\x00b:tasks=2", ["env must be an environment's name or *"]),
    ("env=a:tasks=2:tasks=4", ["tasks given twice"]),
    ("env=a:tasks=2;env=a:tasks=2:size=3", ["two entries for the same env and tasks"]),
    ("env=a:tasks", ["'tasks' is not one of"]),
])
def test_a_malformed_pool_names_the_field_and_what_is_allowed(text: str, names: list[str]) -> None:
    with pytest.raises(PoolConfigError) as caught:
        parse_pool(text)
    for name in names:
        assert name in str(caught.value)


def test_settings_refuse_a_malformed_pool_at_start_up() -> None:
    with pytest.raises(ValidationError, match="size must be a whole number"):
        Settings(pool="env=a:tasks=2:size=0")
    assert Settings(pool="env=a:tasks=2").pool_entries() == (PoolEntry("a", 2),)


def test_an_order_is_placed_once_and_taken_back_whole(tmp_path: Path) -> None:
    files = PoolFolder(tmp_path)
    assert files.place_order({"id": "phase-1", "kind": "attempt"})
    assert not files.place_order({"id": "phase-2", "kind": "attempt"})  # busy: a second order never lands
    assert files.read_order() == {"id": "phase-1", "kind": "attempt"}
    assert not files.finished("phase-1", 2)
    write_atomic(files.done(0), {"order": "phase-1", "exit": 0})
    write_atomic(files.done(1), {"order": "phase-0", "exit": 0})  # a stale report of an earlier order
    assert not files.finished("phase-1", 2)
    write_atomic(files.done(1), {"order": "phase-1", "exit": 0})
    assert files.finished("phase-1", 2)
    files.clear_order("phase-1", 2)
    assert files.read_order() is None and not files.done(0).exists()
    assert files.place_order({"id": "phase-2", "kind": "attempt"})
    assert not list(tmp_path.glob(".*tmp"))  # no temporary left behind


def test_what_a_worker_writes_is_read_as_bounded_json_only(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"state": "idle"}))
    assert read_pool_file(good) == {"state": "idle"}
    link = tmp_path / "link.json"
    link.symlink_to(good)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "a" * MAX_POOL_FILE_BYTES}))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    nul = tmp_path / "nul.json"
    nul.write_bytes(b'{"state": "idle"\x00}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path in (link, big, fifo, listed, nul, deep, tmp_path / "absent.json"):
        assert read_pool_file(path) is None, path.name


def _worker(tmp_path: Path, tasks: int = 2, hang_s: float = 5.0) -> tuple[Settings, PoolFolder]:
    settings = Settings(run_folder=tmp_path / "runs")
    files = PoolFolder(pool.pool_root(settings) / "e1-t2-abc")
    files.folder.mkdir(parents=True)
    write_atomic(files.record, {"env_id": 1, "env_name": "e", "tasks": tasks, "executor": "local", "job_id": "1",
                                "started": None, "created": time.time(), "hang_s": hang_s, "idle_s": 300})
    return settings, files


def test_a_warm_attempt_runs_while_its_worker_beats_and_is_infra_when_it_stops(tmp_path: Path) -> None:
    settings, files = _worker(tmp_path)
    name = "pool:e1-t2-abc:phase-7"
    alive = JobStatus(kind="running", raw="RUNNING")
    files.place_order({"id": "phase-7", "kind": "attempt"})
    for rank in range(2):
        write_atomic(files.heartbeat(rank), {"state": "busy", "order": "phase-7"})
    assert pool.warm_status(settings, name, alive) == JobStatus("running", "RUNNING")
    # rank 1 stops beating (killed, or the node froze): an infrastructure failure, never a verdict
    old = time.time() - 60
    os.utime(files.heartbeat(1), (old, old))
    assert pool.warm_status(settings, name, alive) == JobStatus("infra", "WORKER_HUNG")
    os.utime(files.heartbeat(1))
    # the worker's allocation ended under the attempt
    assert pool.warm_status(settings, name, JobStatus("infra", "CANCELLED")).kind == "infra"
    assert pool.warm_status(settings, name, JobStatus("failed", "FAILED")).raw == "WORKER_FAILED"
    # every task's attempt child exited: the job's end, its documents say the rest (as a cold job's)
    for rank in range(2):
        write_atomic(files.done(rank), {"order": "phase-7", "exit": 0})
    assert pool.warm_status(settings, name, alive) == JobStatus("failed", "ORDER_ENDED")
    # a worker whose folder is gone
    assert pool.warm_status(settings, "pool:e1-t2-gone:phase-7", alive) == JobStatus("infra", "WORKER_GONE")
    with pytest.raises(ValueError, match="names no pool worker"):
        pool.warm_status(settings, "pool:../x:phase-7", alive)


def test_worker_states_from_their_files(tmp_path: Path) -> None:
    settings, files = _worker(tmp_path)
    worker = pool.list_workers(settings)[0]
    assert pool.view(settings, worker, None).state == "starting"  # no heartbeat yet
    since = time.time() - 42
    for rank in range(2):
        write_atomic(files.heartbeat(rank), {"state": "idle", "order": None, "since": since})
    idle = pool.view(settings, worker, None)
    assert idle.state == "idle" and idle.idle_s >= 41
    files.place_order({"id": "phase-1", "kind": "attempt"})
    assert pool.view(settings, worker, None).state == "busy"
    assert pool.view(settings, worker, JobStatus("infra", "CANCELLED")).state == "dead"
    files.retired.write_text("test")
    assert pool.list_workers(settings) == []  # a retired worker is never routed to
