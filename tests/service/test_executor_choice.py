"""PARITY_EXECUTOR=auto picks Slurm when a controller answers and local processes otherwise."""

from __future__ import annotations

import pytest

from service.core.settings import Settings
from service.executors import selection as slurm_module


@pytest.fixture(autouse=True)
def _fresh_cache():
    slurm_module._CACHE.clear()
    yield
    slurm_module._CACHE.clear()


def test_auto_picks_local_without_slurm(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with caplog.at_level("INFO"):
        assert slurm_module.pick_executor(Settings(executor="auto")) == "local"
    assert "picked local" in caplog.text


def test_auto_picks_slurm_when_it_answers(slurm: str, caplog) -> None:
    with caplog.at_level("INFO"):
        assert slurm_module.pick_executor(Settings(executor="auto")) == "slurm"
    assert "picked slurm" in caplog.text


def test_explicit_choice_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert slurm_module.pick_executor(Settings(executor="slurm")) == "slurm"
    assert slurm_module.pick_executor(Settings(executor="local")) == "local"


def test_sbatch_extra_args_parse_pairs_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_SLURM_EXTRA_ARGS", "account=ml, qos=ci ,hold")  # as an operator writes it
    assert Settings().sbatch_extra() == {"account": "ml", "qos": "ci", "hold": True}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        Settings(slurm_extra_args=["bad key=1"])


def test_the_scheduler_decides_once_and_never_falls_back_to_local(
    slurm: str, committed_db: str, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    from fastapi.testclient import TestClient

    from service.scheduler.loop import decide_executor, heartbeat, tick
    from service.web.app import create_app
    from tests.plugins.scheduler_harness import phases, queue

    settings = Settings(executor="auto", run_folder=tmp_path / "runs", max_infra_retries=0)
    with caplog.at_level("INFO"):
        executor = decide_executor(settings)
    assert executor == "slurm" and "executor slurm for the life of this scheduler" in caplog.text
    heartbeat("replica-1", executor)
    with TestClient(create_app()) as client:
        assert client.get("/api/v1/healthz").json()["scheduler"]["executor"] == "slurm"
    # Slurm goes away after start-up: `auto` must not turn into training on the service host
    monkeypatch.setenv("PATH", "/nonexistent")
    slurm_module._CACHE.clear()
    run_id = queue({"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 1})
    tick(settings, executor=executor)
    rows = phases(run_id)
    assert [(p.executor, p.state, p.job_id) for p in rows] == [("slurm", "infra_failed", None)]
    assert "submission failed" in (rows[0].exit_reason or "")
