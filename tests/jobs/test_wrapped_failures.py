"""A checkpoint failure torch.distributed.checkpoint wraps is judged by what failed, where it was raised.

torch DCP gathers every rank's exception with its frames into a CheckpointException, a BaseException raised from
its own reduce_scatter: read as it comes, a build whose load refuses a shape (the padded vocabulary held to its
saved shape) escaped the stage's `except Exception` and read as a transport frame, so the build's answer was an
exit 2 "couldn't tell". Pure: frames compiled under the build's and torch's paths, no Megatron.
"""

from __future__ import annotations

import traceback as tb
from pathlib import Path
from typing import Any

import pytest

from jobs.contract import exception_record
from jobs.rank.context import PhaseAbort, RankContext
from jobs.verdict.build_crash import raised_in_build

BUILD_FILE = "/site-packages/megatron/core/dist_checkpointing/strategies/torch.py"
TORCH_FILE = "/site-packages/torch/distributed/checkpoint/utils.py"


class CheckpointingException(Exception):
    """As Megatron-Core names its own."""


class CheckpointException(BaseException):
    """torch.distributed.checkpoint.api's: a BaseException carrying {rank: (exception, its frames)}."""

    def __init__(self, msg: str, failures: dict[int, tuple[BaseException, tb.StackSummary]]) -> None:
        super().__init__(msg, failures)
        self.failures = failures


def _raise_in(path: str, function: str, exc: BaseException) -> None:
    namespace: dict[str, Any] = {"exc": exc}
    exec(compile(f"def {function}():\n    raise exc\n", path, "exec"), namespace)
    namespace[function]()


def _dcp_failure() -> CheckpointException:
    try:
        _raise_in(BUILD_FILE, "_validate_global_shapes", CheckpointingException(
            "Global shape mismatch for loaded (1280, 128) and expected (1152, 128) tensor for key "
            "embedding.word_embeddings.weight"))
    except CheckpointingException as inner:
        wrapped = CheckpointException("CheckpointException ranks:[0]", {0: (inner, tb.extract_tb(inner.__traceback__))})
    try:
        _raise_in(TORCH_FILE, "reduce_scatter", wrapped)
    except CheckpointException as outer:
        return outer
    raise AssertionError("not raised")


def test_a_wrapped_failure_is_recorded_as_the_ranks_own_exception_in_the_builds_frame() -> None:
    record = exception_record(_dcp_failure(), "load", 0)
    assert record["type"] == "CheckpointingException"
    assert "embedding.word_embeddings.weight" in record["message"]
    assert raised_in_build(record) == "megatron/core/dist_checkpointing/strategies/torch.py:_validate_global_shapes"


def test_a_failure_raised_in_torch_distributed_itself_stays_the_transports() -> None:
    """Unwrapping stops at the rank's own frames: a wrapped failure raised in torch.distributed is no build's."""
    try:
        _raise_in(TORCH_FILE, "all_gather", RuntimeError("Connection closed by peer"))
    except RuntimeError as inner:
        outer = CheckpointException("ranks:[1]", {1: (inner, tb.extract_tb(inner.__traceback__))})
    record = exception_record(outer, "load", 0)
    assert record["type"] == "RuntimeError" and raised_in_build(record) is None


def test_a_stage_records_a_base_exception_from_the_build_and_lets_an_interrupt_through(tmp_path: Path) -> None:
    ctx = RankContext(tmp_path, 0, {"info": {}})  # type: ignore[typeddict-item]

    def load() -> None:
        raise _dcp_failure()

    with pytest.raises(PhaseAbort) as abort:
        ctx.run("load", load, 30.0)
    assert abort.value.errors[0]["type"] == "CheckpointingException"
    assert abort.value.errors[0]["stage"] == "load"

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ctx.run("load", interrupted, 30.0)
