"""Build probes of jobs/rank/compat.py for old releases, read on the installed Megatron-Core (0.16.1).

The other side of each probe (0.12.x-0.14.x) is measured by the release sweep (docs/releases.md):
0.12.3's writer is unsupported on torch 2.13, 0.13.1 / 0.14.0 save through a forked writer.
"""

from __future__ import annotations

import inspect

import numpy
import pytest

from jobs.rank import compat

pytestmark = pytest.mark.megatron


def test_this_build_writes_a_synchronous_save_in_process() -> None:
    from megatron.core.dist_checkpointing.strategies.base import AsyncSaveShardedStrategy

    # 0.15+ (ADLR/megatron-lm!3600): execute_sync, so the in-process results queue is safe here
    assert "execute_sync" in inspect.getsource(AsyncSaveShardedStrategy.save)
    assert compat.sync_save_forks() is False


def test_this_builds_writer_matches_this_torch_and_needs_no_numpy_shim() -> None:
    from torch.distributed.checkpoint import filesystem

    # torch 2.13 requires serialization_format; 0.16.1 passes it, so the save is offered
    assert "serialization_format" in inspect.signature(filesystem._write_item).parameters
    compat.check_writer()
    # NumPy 2 has no numpy.product; 0.16.1 calls np.prod, so nothing is aliased
    assert not hasattr(numpy, "product")
    assert compat._numpy_product_shim() == []
    assert not hasattr(numpy, "product")
