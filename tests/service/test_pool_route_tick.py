"""One tick's launch pass with a warm pool: a key whose workers are all busy answers WAIT for the rest
of the tick without looking again, an order a dead scheduler placed is still adopted on a full key,
and the next tick places the waiting attempt on a worker that turned idle meanwhile; a suite's checks wait
for its on-demand worker with no PARITY_POOL entry, and hold no run outside the suite behind them; a worker
a suite wants only soon starts once its environment's first worker has imported.

Real Postgres rows and real worker folders (written as a worker writes them); nothing is submitted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from jobs.pool_folder import PoolFolder, write_atomic
from models import Environment, Phase, Run
from service.core.db import session_scope
from service.core.phase_state import PhaseState
from service.core.settings import Settings
from service.executors import pool
from service.runs import pool_dispatch
from service.scheduler.submitter import claim_queued, launch, next_pending
from tests.plugins.scheduler_harness import GOOD, phases, queue, register_environment

pytestmark = pytest.mark.postgres
SPEC = {"config": "dense-bf16", "dp": 2, "steps": 4, "save_step": 2, "workarounds": GOOD, "isolation": "process"}


@pytest.fixture
def settings(committed_db: str, tmp_path: Path) -> Settings:
    return Settings(database_url=committed_db, run_folder=tmp_path / "runs", executor="slurm",
                    pool="env=pooled:tasks=2:size=1:idle=600")


def _worker(settings: Settings, name: str, env_id: int, state: str, order: str | None = None) -> PoolFolder:
    files = PoolFolder(pool.pool_root(settings) / name)
    files.folder.mkdir(parents=True, exist_ok=True)
    write_atomic(files.record, {"env_id": env_id, "env_name": "pooled", "tasks": 2, "executor": "slurm",
                                "job_id": "4242", "started": None, "created": time.time() - 5, "hang_s": 30,
                                "idle_s": 600})
    for rank in range(2):
        write_atomic(files.heartbeat(rank), {"state": state, "order": order, "since": time.time() - 1})
    if order:
        files.place_order({"id": order, "kind": "attempt"})
    return files


def _pending(settings: Settings, n: int) -> tuple[int, list[int]]:
    register_environment("pooled", sys.executable)
    runs = [queue(SPEC, environment="pooled") for _ in range(n)]
    with session_scope() as session:
        assert claim_queued(session, settings=settings, executor="slurm") == n
        env_id = session.get(Run, runs[0]).environment_id  # type: ignore[union-attr]
    return env_id, [phases(r)[0].id for r in runs]


def _launch(settings: Settings, waits: pool_dispatch.TickWaits) -> Phase | None:
    with session_scope() as session:
        phase = next_pending(session, waits.phases)
        if phase is None:
            return None
        launch(session, phase, settings=settings, executor="slurm", waits=waits)
        session.flush()
        session.expunge(phase)
        return phase


def test_a_full_key_waits_for_the_rest_of_the_tick_and_the_next_tick_places(settings: Settings) -> None:
    env_id, ids = _pending(settings, 3)
    _worker(settings, "busy", env_id, "busy", "phase-999")
    waits = pool_dispatch.TickWaits()
    first = _launch(settings, waits)
    assert first is not None and first.state == PhaseState.PENDING.value
    assert waits.full_keys == {(env_id, 2, 0)} and waits.phases == {ids[0]}
    # a worker turning idle mid-tick is left to the next tick: this one already knows the key is full
    idle = _worker(settings, "idle", env_id, "idle")
    second = _launch(settings, waits)
    assert second is not None and second.state == PhaseState.PENDING.value and idle.read_order() is None
    # the next tick looks again and hands the oldest waiting attempt to the idle worker
    placed = _launch(settings, pool_dispatch.TickWaits())
    assert placed is not None and placed.id == ids[0] and placed.state == PhaseState.SUBMITTED.value
    assert placed.job_name == f"{pool.WARM_PREFIX}idle:phase-{ids[0]}"
    assert (idle.read_order() or {}).get("id") == f"phase-{ids[0]}"


def test_an_order_already_placed_is_adopted_even_on_a_full_key(settings: Settings) -> None:
    env_id, ids = _pending(settings, 2)
    _worker(settings, "busy", env_id, "busy", "phase-999")
    waits = pool_dispatch.TickWaits()
    assert _launch(settings, waits) is not None and waits.full_keys == {(env_id, 2, 0)}
    # a scheduler that died after placing the second attempt's order, before recording it
    _worker(settings, "holder", env_id, "busy", f"phase-{ids[1]}")
    adopted = _launch(settings, waits)
    assert adopted is not None and adopted.id == ids[1]
    assert adopted.state == PhaseState.SUBMITTED.value
    assert adopted.job_name == f"{pool.WARM_PREFIX}holder:phase-{ids[1]}"


def test_attempts_waiting_on_a_full_key_do_not_hide_the_rest_of_the_queue(settings: Settings) -> None:
    env_id, ids = _pending(settings, 12)  # more than a tick's ten launches
    other = queue(SPEC)  # the default environment: no pool entry, so it goes cold
    with session_scope() as session:
        claim_queued(session, settings=settings, executor="slurm")
    cold_phase = phases(other)[0].id
    _worker(settings, "busy", env_id, "busy", "phase-999")
    first_tick = pool_dispatch.TickWaits()
    for _ in range(10):
        _launch(settings, first_tick)
    # the next tick (the loop keeps the keys) looks at the oldest waiting attempt once, then straight
    # past its key's others
    waits = pool_dispatch.TickWaits(keys=first_tick.keys)
    oldest = _launch(settings, waits)
    assert oldest is not None and oldest.id == ids[0] and waits.full_keys == {(env_id, 2, 0)}
    assert set(ids[:10]) <= waits.skip()
    with session_scope() as session:
        following = next_pending(session, waits.skip())
        assert following is not None and following.id in (*ids[10:], cold_phase)
        rest = {following.id}
        while (nxt := next_pending(session, waits.skip() | rest)) is not None and len(rest) < 5:
            rest.add(nxt.id)
    assert cold_phase in rest  # reached in this tick, not after the pool drains


def _route(settings: Settings, run_id: int, waits: pool_dispatch.TickWaits, folder: Path) -> object:
    with session_scope() as session:
        phase = session.get(Phase, phases(run_id)[0].id)
        run = session.get(Run, run_id)
        assert phase is not None and run is not None
        return pool_dispatch.route(session, phase, run, settings=settings, executor="slurm", entry_name="attempt",
                                   args=(None,) * 6, tasks=2, nodes=1, job_folder=folder, waits=waits)


def test_a_suites_checks_wait_for_its_worker_without_any_pool_entry_and_other_runs_go_cold(
    committed_db: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=committed_db, run_folder=tmp_path / "runs", executor="slurm")  # no PARITY_POOL
    register_environment("pooled", sys.executable)
    checks = [queue(SPEC, labels={"suite_run": "s1", "suite_check": f"c{i}"}, environment="pooled") for i in (1, 2)]
    plain = queue(SPEC, environment="pooled")
    with session_scope() as session:
        claim_queued(session, settings=settings, executor="slurm")
        env_id = session.get(Run, plain).environment_id  # type: ignore[union-attr]
    _worker(settings, "suite-worker", env_id, "busy", "phase-999")
    waits = pool_dispatch.TickWaits()
    assert _route(settings, checks[0], waits, tmp_path) == pool_dispatch.WAIT
    assert waits.full_keys == waits.suite_keys == {(env_id, 2, 0)}
    # the key is full for the suite's checks only: a run outside the suite is not held behind them
    assert _route(settings, plain, waits, tmp_path) is None
    assert _route(settings, checks[1], waits, tmp_path) == pool_dispatch.WAIT
    # with PARITY_SUITE_WARM off a suite's check goes cold like any other run
    off = Settings(database_url=committed_db, run_folder=tmp_path / "runs", executor="slurm", suite_warm=False)
    assert _route(off, checks[0], pool_dispatch.TickWaits(), tmp_path) is None


def test_a_worker_wanted_only_soon_starts_once_its_environments_first_worker_is_up(
    committed_db: str, tmp_path: Path
) -> None:
    # a suite's resharded resume (DP 2 saved, DP 1 resumed) wants a 1-task worker soon; the suite's 2-task
    # worker is still importing: on 2 cores a second import beside it slowed the one every check waits for
    settings = Settings(database_url=committed_db, run_folder=tmp_path / "runs", executor="local")
    register_environment("pooled", sys.executable)
    with session_scope() as session:
        env = session.scalars(select(Environment).where(Environment.name == "pooled")).one()
        session.expunge(env)
    entry = pool_dispatch.suite_entry(settings, env.name, 1, {"suite_run": "s1"})
    assert entry is not None
    both = pool_dispatch.Demand()
    both.add(env, 1, entry, pending=False)
    both.add(env, 2, pool_dispatch.suite_entry(settings, env.name, 2, {"suite_run": "s1"}), pending=True)  # type: ignore[arg-type]
    demand = pool_dispatch.Demand()
    demand.add(env, 1, entry, pending=False)
    try:
        # one tick, no worker yet: the worker the checks wait for starts, the soon one not beside it
        assert pool_dispatch._grow(settings, "local", both) == 1
        assert [w.tasks for w in pool.list_workers(settings)] == [2]
        for worker in pool.list_workers(settings):
            pool.retire(worker, "test: the next case", hard=True)
        first = _worker(settings, "suite-first", env.id, "starting")
        assert pool_dispatch._grow(settings, "local", demand) == 0
        assert [w.name for w in pool.list_workers(settings)] == ["suite-first"]
        # up: the resume's worker imports now, while the suite's checks run
        for rank in range(2):
            write_atomic(first.heartbeat(rank), {"state": "idle", "order": None, "since": time.time()})
        assert pool_dispatch._grow(settings, "local", demand) == 1
    finally:  # a real local worker job was started: stopped here
        for worker in pool.list_workers(settings):
            if worker.name != "suite-first":
                pool.retire(worker, "test over", hard=True)


def test_a_keys_workers_import_one_at_a_time_on_a_small_host(
    committed_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suite that may run two checks at once (PARITY_SUITE_WORKERS=2) on 2 cores: its second worker starts once
    the first is up, not beside it, where both imports slowed the first check's start (7.8 s -> 13.5 s)."""
    monkeypatch.setattr(pool_dispatch, "IMPORTS_AT_ONCE", 1)  # what a 2-CPU host computes
    settings = Settings(database_url=committed_db, run_folder=tmp_path / "runs", executor="local", suite_workers=2)
    register_environment("pooled", sys.executable)
    with session_scope() as session:
        env = session.scalars(select(Environment).where(Environment.name == "pooled")).one()
        session.expunge(env)
    entry = pool_dispatch.suite_entry(settings, env.name, 2, {"suite_run": "s1"})
    assert entry is not None and entry.size == 2
    demand = pool_dispatch.Demand()
    demand.add(env, 2, entry, pending=True)
    demand.add(env, 2, entry, pending=True)  # two checks wait
    try:
        assert pool_dispatch._grow(settings, "local", demand) == 1
        assert pool_dispatch._grow(settings, "local", demand) == 0  # the first still imports
        (first,) = pool.list_workers(settings)
        for rank in range(2):
            write_atomic(first.files.heartbeat(rank), {"state": "idle", "order": None, "since": time.time()})
        assert pool_dispatch._grow(settings, "local", demand) == 1  # up (idle): the second starts now
        assert len(pool.list_workers(settings)) == 2
    finally:  # real local worker jobs were started: stopped here
        for worker in pool.list_workers(settings):
            pool.retire(worker, "test over", hard=True)
