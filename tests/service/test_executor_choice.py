"""PARITY_EXECUTOR=auto picks Slurm when a controller answers and local processes otherwise."""

from __future__ import annotations

import pytest

from service import slurm as slurm_module
from service.settings import Settings


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


def test_sbatch_extra_args_parse_pairs_and_flags() -> None:
    settings = Settings(slurm_extra_args="account=ml, qos=ci ,hold")
    assert settings.sbatch_extra() == {"account": "ml", "qos": "ci", "hold": True}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        Settings(slurm_extra_args="bad key=1")
