"""Bucket-offset probe (Bug B) on hand-built buffers: a clean one and an injected misalignment."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from jobs.rank.probes.buckets import check_buffer


def _buffer(numels: list[int], padded_index: bool) -> tuple[SimpleNamespace, dict]:
    """A one-bucket buffer laid out like Megatron's: starts padded to 64, params views into it.

    `padded_index` False reproduces core_v0.16.x: param_to_index is cumulative numel without padding.
    """
    params = [torch.nn.Parameter(torch.arange(n, dtype=torch.float32) + 1000 * i) for i, n in enumerate(numels)]
    index_map, start = {}, 0
    for p in params:
        start = -(-start // 64) * 64
        index_map[p] = (start, start + p.numel(), 0)
        start += p.numel()
    data = torch.zeros(-(-start // 128) * 128)
    for p in params:
        s, e, _ = index_map[p]
        data[s:e] = p.detach()
    cumulative, offset = {}, 0
    for p in params:
        cumulative[p] = (offset, offset + p.numel())
        offset += p.numel()
    bucket = SimpleNamespace(
        params_list=params,
        offset=0,
        param_data=data,
        param_to_index={p: index_map[p][:2] for p in params} if padded_index else cumulative,
    )
    names = {p: f"p{i}" for i, p in enumerate(params)}
    return SimpleNamespace(buckets=[bucket], param_index_map=index_map, param_dtype=torch.float32), names


def test_clean_buffer_passes() -> None:
    buf, names = _buffer([1, 100, 512, 7], padded_index=True)
    assert check_buffer(buf, names)["issues"] == []


def test_unpadded_param_to_index_is_flagged() -> None:
    buf, names = _buffer([1, 100, 512, 7], padded_index=False)
    issues = check_buffer(buf, names)["issues"]
    flagged = {i["param"] for i in issues}
    # p0 starts at 0 either way; every later param is shifted by the missing padding.
    assert flagged == {"p1", "p2", "p3"}
    p1 = next(i for i in issues if i["param"] == "p1")
    assert p1["expected"] == [64, 164] and p1["param_to_index"] == [1, 101]
    assert any("param_data slice" in msg for msg in p1["problems"])


def test_multiples_of_64_hide_the_bug() -> None:
    # Why configs need an odd-sized param: with 64-multiples the unpadded offsets coincide.
    buf, names = _buffer([64, 128, 512], padded_index=False)
    assert check_buffer(buf, names)["issues"] == []


def test_unaligned_start_is_flagged() -> None:
    buf, names = _buffer([64, 64], padded_index=True)
    p = buf.buckets[0].params_list[1]
    buf.param_index_map[p] = (65, 129, 0)
    buf.buckets[0].param_to_index[p] = (65, 129)
    problems = check_buffer(buf, names)["issues"][0]["problems"]
    assert any("not a multiple of 64" in msg for msg in problems)
