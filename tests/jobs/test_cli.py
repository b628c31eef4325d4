"""CLI subcommands through a tiny argparse wrapper (service/cli/main.py registers them the same way)."""

from __future__ import annotations

import argparse
import json

import pytest

from service.cli.client import configs
from service.cli.engine import run_local


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity")
    sub = parser.add_subparsers(dest="command", required=True)
    run_local.register(sub)
    configs.register(sub)
    return parser


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "moe-fp32-router", "--dp", "2", "--steps", "4", "--save-step", "4"],
        ["--config", "nope", "--dp", "2", "--steps", "4", "--save-step", "2"],
        ["--config", "dense-bf16", "--dp", "64", "--steps", "4", "--save-step", "2"],
        ["--config", "dense-bf16", "--dp", "2", "--steps", "4", "--save-step", "2", "--workaround", "magic"],
    ],
)
def test_bad_spec_exits_2_before_launch(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs.launch.local

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("nothing may be launched for a bad spec")

    monkeypatch.setattr(jobs.launch.local, "run_parity", refuse)
    assert _run(["run-local", *argv, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "invalid spec" in err


def test_configs_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["configs", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any(c["name"] == "moe-fp32-router" for c in data)


def test_configs_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["configs"]) == 0
    assert "moe-fp32-router" in capsys.readouterr().out
