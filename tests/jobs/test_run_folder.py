"""The run folder: every attempt of every phase has its own folder, logs and checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.run_folder import RunFolder


def test_attempts_never_share_a_folder_or_a_checkpoint(tmp_path: Path) -> None:
    run_dir = RunFolder(tmp_path)
    first, retry = run_dir.attempt("train_and_save", 1), run_dir.attempt("train_and_save", 2)
    resume = run_dir.attempt("resume", 1)
    assert len({first.folder, retry.folder, resume.folder}) == 3
    assert first.checkpoint(4) != retry.checkpoint(4)
    assert first.rank_log(0) == tmp_path / "train_and_save" / "attempt-1" / "rank0.log"
    assert retry.result(1) == tmp_path / "train_and_save" / "attempt-2" / "result.rank1.json"
    assert first.submitit.parent == first.folder


def test_logs_lists_rank_logs_then_job_output_only(tmp_path: Path) -> None:
    attempt = RunFolder(tmp_path).attempt("resume", 1)
    attempt.submitit.mkdir(parents=True)
    for path in (attempt.rank_log(1), attempt.rank_log(0), attempt.submitit / "7_0_log.out",
                 attempt.submitit / "7_0_log.err", attempt.submitit / "7_submitted.pkl", attempt.result(0)):
        path.write_text("x")
    assert [p.name for p in attempt.logs()] == ["rank0.log", "rank1.log", "7_0_log.err", "7_0_log.out"]


def test_attempts_count_from_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="attempt"):
        RunFolder(tmp_path).attempt("resume", 0)
