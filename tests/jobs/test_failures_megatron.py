"""Failure paths with real ranks: a one-sided crash comes back as a document, not a hang."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from jobs.launch.local import run_parity
from jobs.run_folder import RunFolder
from jobs.spec import RunSpec
from service.cli.engine import run_local
from tests.plugins.job_faults import plugin_folder, with_plugin

pytestmark = pytest.mark.megatron


@pytest.mark.parametrize("stage", ["save", pytest.param("step", marks=pytest.mark.nightly)])
def test_one_sided_crash_returns_a_document(stage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults = plugin_folder(tmp_path / "faults", fault=f"{stage}:1")  # a test-only plugin
    monkeypatch.setenv("PYTHONPATH", with_plugin(dict(os.environ), faults)["PYTHONPATH"])
    spec = RunSpec(config="dense-bf16", dp=2, steps=4, save_step=2)
    r = run_parity(spec, tmp_path)  # returning at all is the point: a one-sided crash must not hang
    assert r["verdict"] == "error"
    assert r["error"] is not None and r["error"]["stage"] == stage and "injected fault" in r["error"]["message"]
    if stage == "save":
        assert r["signatures"] == ["checkpoint-save-crash"]
        assert r["error"].get("rank") == 1  # rank 0 agreed on rank 1's failure instead of entering the save


@pytest.mark.nightly
def test_run_local_json_prints_one_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    run_local.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "run-local",
            "--config",
            "dense-bf16",
            "--dp",
            "1",
            "--steps",
            "4",
            "--save-step",
            "2",
            "--workaround",
            "restore-adam-step",
            "--workaround",  # dense-bf16's decoupled-LR groups, which 0.16.1 loads into one another
            "match-groups-by-lr-bounds",
            "--run-folder",
            str(tmp_path),
            "--json",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert out.count("\n") == 1 and doc["verdict"] == "pass" and doc["spec"]["dp"] == 1
    assert (tmp_path / "result.json").exists()
    assert RunFolder(tmp_path).attempt("train_and_save", 1).checkpoint(2).is_dir()
