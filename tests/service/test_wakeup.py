"""The scheduler's wake-ups: a committed queued run notifies it, a rollback does not, files wake it too."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import func, select

from models import Run
from service.core.check_spec import run_spec_of
from service.core.db import get_engine, session_scope
from service.core.settings import get_settings
from service.environments.registry import ensure_default_environment
from service.runs.records import create_run
from service.scheduler.wakeup import Wakeup
from tests.plugins.scheduler_harness import queue

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}


def _url() -> str:
    return get_engine().url.render_as_string(hide_password=False)


def test_a_committed_run_wakes_the_scheduler(committed_db: str) -> None:
    stop = threading.Event()
    wake = Wakeup(_url, stop)
    try:
        assert wake.wait(0.2) == "timeout"  # listening now; nothing queued yet
        threading.Timer(0.3, lambda: queue(SPEC)).start()
        assert wake.wait(60) == "notify"
        assert wake.wait(0.2) == "timeout"  # that notification was consumed, not replayed
    finally:
        wake.close()


def test_a_rolled_back_insert_does_not(committed_db: str) -> None:
    stop = threading.Event()
    wake = Wakeup(_url, stop)
    try:
        wake.wait(0.1)
        with session_scope() as session:
            before = session.scalar(select(func.count()).select_from(Run))
        try:
            with session_scope() as session:
                env = ensure_default_environment(session, settings=get_settings())
                create_run(session, spec=run_spec_of(SPEC), environment=env, labels={}, requester="t")
                session.flush()  # the INSERT (and its trigger) ran; the transaction then rolls back
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        assert wake.wait(1.0) == "timeout"
        with session_scope() as session:
            assert session.scalar(select(func.count()).select_from(Run)) == before
    finally:
        wake.close()


def test_a_result_file_or_stop_ends_the_wait(tmp_path: Path, committed_db: str) -> None:
    stop = threading.Event()
    wake = Wakeup(_url, stop)
    target = tmp_path / "train_and_save" / "result.rank0.json"
    try:
        target.parent.mkdir()
        threading.Timer(0.3, target.write_text, args=("{}",)).start()
        assert wake.wait(60, [target]) == "file"
        threading.Timer(0.3, stop.set).start()
        assert wake.wait(60) == "stop"
    finally:
        wake.close()


def test_without_a_database_it_still_polls() -> None:
    wake = Wakeup(lambda: "postgresql+psycopg://nobody@127.0.0.1:1/none", threading.Event())
    assert wake.wait(0.3) == "timeout"  # LISTEN failed: a plain sleep, no exception
    wake.close()
