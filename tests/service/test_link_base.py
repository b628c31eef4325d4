"""Links from one place: PARITY_PUBLIC_URL, else the address `parity serve` recorded, else the request's host."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from service.cli.client.config import service_target
from service.cli.common import setup_logging
from service.core.links import public_base, record_serving, recorded_url, warn_if_unknown
from service.core.settings import Settings, get_settings


def _settings(tmp_path: Path, **extra: object) -> Settings:
    return Settings(run_folder=tmp_path / "runs", database_url="postgresql://x/y", **extra)  # type: ignore[arg-type]


def test_recorded_address_wins_over_the_default_port(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings(tmp_path)
    assert public_base(settings) == "http://127.0.0.1:8000" and recorded_url(settings) is None
    with caplog.at_level(logging.WARNING):
        warn_if_unknown(settings, "scheduler")
        assert "neither PARITY_PUBLIC_URL nor a running `parity serve`" in caplog.text
        assert record_serving(settings, "127.0.0.1", 8742) == "http://127.0.0.1:8742"
        assert "PARITY_PUBLIC_URL is not set" in caplog.text
    # the scheduler (no request) now links to the port the server really listens on
    assert public_base(settings) == "http://127.0.0.1:8742"
    public = _settings(tmp_path, public_url="https://parity.example.com/")
    assert public_base(public) == "https://parity.example.com"


def test_client_commands_say_which_variable_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("PARITY_SERVICE_URL", "PARITY_TOKEN", "PARITY_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARITY_RUN_FOLDER", str(tmp_path / "runs"))
    get_settings.cache_clear()
    try:
        url, token = service_target(argparse.Namespace(url=None, token=None), "submit")
        err = capsys.readouterr().err
        assert "PARITY_SERVICE_URL is not set" in err and "PARITY_TOKEN is not set" in err
        assert token is None and url.startswith("http://")
        monkeypatch.setenv("PARITY_SERVICE_URL", "http://svc:8742/")
        monkeypatch.setenv("PARITY_TOKEN", "t0k")
        get_settings.cache_clear()
        assert service_target(argparse.Namespace(url=None, token=None), "submit") == ("http://svc:8742", "t0k")
        assert capsys.readouterr().err == ""
    finally:
        get_settings.cache_clear()


def test_http_client_logs_only_with_verbose() -> None:
    setup_logging(False)
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
