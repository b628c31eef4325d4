"""`parity submit --wait` with stdout a file (as on every CI runner): the link at once, a line per check as it
ends and a heartbeat naming what it waits for, each readable while the command still runs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session

from models import Run
from service.cli.client.progress import Heartbeat, waiting_for
from service.core.state_names import MAX_WAIT_S
from service.core.tokens import create_token
from tests.plugins.server import configure, serve

# A heartbeat of 1 s must come in about 1 s, not when a long poll that found no change answers (up to
# MAX_WAIT_S later): the wait holds no longer than until the heartbeat is due. Half a poll's hold is a
# wide margin for a loaded host and still fails a client that waits the poll out.
HEARTBEAT_BOUND_S = MAX_WAIT_S / 2

SMALL = {"name": "small", "description": "two checks", "checks": [
    {"name": "dp2-dense", "spec": {"config": "dense-bf16", "dp": 2, "steps": 6, "save_step": 3}},
    {"name": "layerwise", "spec": {"config": "layerwise-empty-rank", "dp": 2, "steps": 6, "save_step": 3}},
]}


def _until(condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert proc.poll() is None, f"the command ended before {what}"
        time.sleep(0.1)


def test_submit_wait_streams_progress_into_a_file(committed_db: str, monkeypatch, tmp_path: Path) -> None:
    configure(monkeypatch)
    engine = create_engine(committed_db)
    with Session(engine) as session:
        admin = create_token(session, name="admin", scopes=["admin"])
        submit = create_token(session, name="ci", scopes=["submit"], tracks=["*"])
        session.commit()
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with serve() as url:
        import httpx

        assert httpx.post(f"{url}/api/v1/suites", json=SMALL,
                          headers={"Authorization": f"Bearer {admin}"}).status_code == 201
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli.main", "submit", "--suite", "small", "--wait", "--heartbeat", "1",
                 "--timeout", "120", "--url", url, "--token", submit],
                stdout=stdout, stderr=stderr, env={**os.environ})
        try:
            text = out.read_text
            _until(lambda: "suite run " in text(), "the suite-run link", proc)
            assert text().startswith("suite run ") and "/suite-runs/" in text().splitlines()[0]
            _until(lambda: "queued 2/2" in text(), "a heartbeat naming the queued checks", proc, HEARTBEAT_BOUND_S)
            with Session(engine) as session:
                ids = dict(session.execute(select(Run.labels["suite_check"].astext, Run.id)).tuples().all())
                session.execute(update(Run).where(Run.id == ids["dp2-dense"]).values(state="train_running"))
                session.commit()
            _until(lambda: "running 1/2 (train running)" in text(), "a heartbeat naming the running check", proc,
                   HEARTBEAT_BOUND_S)
            with Session(engine) as session:
                session.execute(update(Run).where(Run.id == ids["dp2-dense"]).values(
                    state="failed", verdict="fail", signatures=["lr-schedule-mismatch"], first_divergent_step=4))
                session.commit()
            _until(lambda: any(ln.startswith("dp2-dense") for ln in text().splitlines()), "the ended check's line",
                   proc)
            assert not any(ln.startswith("layerwise") for ln in text().splitlines())  # it has not ended
            with Session(engine) as session:
                session.execute(update(Run).where(Run.id == ids["layerwise"]).values(state="passed", verdict="pass"))
                session.commit()
            assert proc.wait(60) == 1, err.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = out.read_text().splitlines()
    assert lines[-1].startswith("suite verdict: fail"), lines
    assert [ln.split()[0] for ln in lines if ln.split()[0] in ("dp2-dense", "layerwise")] == ["dp2-dense", "layerwise"]
    engine.dispose()


def test_submit_wait_of_one_check_streams_its_link_and_heartbeat(committed_db: str, monkeypatch,
                                                                  tmp_path: Path) -> None:
    configure(monkeypatch)
    engine = create_engine(committed_db)
    with Session(engine) as session:
        submit = create_token(session, name="ci", scopes=["submit"], tracks=["*"])
        session.commit()
    out = tmp_path / "stdout.log"
    with serve() as url, out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "submit", "--config", "dense-bf16", "--dp", "1", "--steps", "6",
             "--save-step", "3", "--wait", "--heartbeat", "1", "--timeout", "120", "--url", url, "--token", submit],
            stdout=stdout, stderr=subprocess.DEVNULL, env={**os.environ})
        try:
            _until(lambda: out.read_text().startswith("run "), "the run's link", proc)
            _until(lambda: "queued 1/1" in out.read_text(), "a heartbeat", proc, HEARTBEAT_BOUND_S)
            with Session(engine) as session:
                session.execute(update(Run).values(state="passed", verdict="pass"))
                session.commit()
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "verdict: pass" in out.read_text()
    engine.dispose()


def test_the_heartbeat_says_what_it_waits_for_and_no_more_often_than_its_period() -> None:
    now = [0.0]
    out = io.StringIO()
    pulse = Heartbeat(every=30, out=out, clock=lambda: now[0])
    runs = [{"state": "queued"}, {"state": "queued"}]
    building = {"name": "pr-1234", "state": "building"}
    now[0] = 29
    pulse.beat(waiting_for(runs, building))
    assert out.getvalue() == ""
    now[0] = 30
    pulse.beat(waiting_for(runs, building))
    pulse.beat(waiting_for(runs, building))  # the period starts again after a line
    assert out.getvalue().splitlines() == [
        "waiting (30s): environment pr-1234 building (the runs start when it is built), queued 2/2"]
    assert waiting_for([{"state": "resume_running"}, {"state": "passed"}], None) == "running 1/2 (resume running), " \
        "done 1/2"
    assert waiting_for(runs, {"name": "default", "state": "ready"}) == "queued 2/2"
