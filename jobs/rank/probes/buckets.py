"""Bug B probe: are each bucket's `param_to_index` offsets the padded buffer offsets?

With the distributed optimizer every param starts at a multiple of 64 in the grad buffer. Up to
core_v0.16.x `_ParamAndGradBucket.param_to_index` was a cumulative numel without that padding,
so MXFP8 param all-gather copied the wrong slice for params whose numel is not a multiple of 64.
`check_buffer` works on any object with the buffer/bucket attributes, so tests can feed it a
hand-built clean buffer or an injected misalignment.
"""

from __future__ import annotations

from typing import Any

import torch

from jobs.rank import compat

ALIGNMENT = 64


def check_bucket(
    bucket: Any,
    param_index_map: dict[Any, tuple[int, ...]],
    name_of: dict[Any, str],
    align: int | None = ALIGNMENT,
) -> list[dict[str, Any]]:
    """Return one issue record per param of `bucket` whose offsets or data slice are wrong."""
    issues = []
    params = list(getattr(bucket, "params_list", None) or bucket.params)
    flat = None if getattr(bucket, "param_data", None) is None else bucket.param_data.view(-1)
    for p in params:
        start, end = param_index_map[p][:2]
        expected = (start - bucket.offset, end - bucket.offset)
        got = tuple(bucket.param_to_index[p])
        problems = []
        if got != expected:
            problems.append("param_to_index != param_index_map - bucket.offset")
        if align and start % align:
            problems.append(f"start {start} not a multiple of {align}")
        if end - start != p.numel():
            problems.append(f"end - start {end - start} != numel {p.numel()}")
        if flat is not None and got[1] <= flat.numel():
            if not torch.equal(flat[got[0] : got[1]], p.detach().reshape(-1)):
                problems.append("bucket.param_data slice at param_to_index differs from param data")
        if problems:
            issues.append(
                {
                    "param": name_of.get(p, "?"),
                    "numel": int(p.numel()),
                    "expected": list(expected),
                    "param_to_index": list(got),
                    "problems": problems,
                }
            )
    return issues


def check_buffer(buffer: Any, name_of: dict[Any, str], align: int | None = ALIGNMENT) -> dict[str, Any]:
    """Check every bucket of one param-and-grad buffer."""
    issues = []
    for b, bucket in enumerate(buffer.buckets):
        for issue in check_bucket(bucket, buffer.param_index_map, name_of, align):
            issues.append({"bucket": b, **issue})
    return {
        "param_dtype": str(getattr(buffer, "param_dtype", "?")).removeprefix("torch."),
        "buckets": len(buffer.buckets),
        "params": sum(len(list(getattr(b, "params_list", None) or b.params)) for b in buffer.buckets),
        "issues": issues,
    }


def probe(ddp: Any, name_of: dict[Any, str]) -> dict[str, Any]:
    """Check all dense and expert-parallel buffers of a Megatron DDP model."""
    align = ALIGNMENT if ddp.ddp_config.use_distributed_optimizer else None
    dense, expert = list(ddp.buffers), list(getattr(ddp, "expert_parallel_buffers", []))
    buffers = dense + expert
    first = next((bucket for buf in buffers for bucket in buf.buckets), None)
    if first is not None and not hasattr(first, "param_to_index"):
        # 0.12.x: buckets keep no per-param offsets, so there is nothing that can be misaligned
        return compat.not_applicable(
            f"{type(first).__name__} has no param_to_index (this build lays buckets out differently)",
            buffers=[], unaligned_total=0,
        )
    # expert-parallel buffers feed the expert-data-parallel DistributedOptimizer: name them
    reports = [
        {"buffer": i, "kind": "dense" if i < len(dense) else "expert", **check_buffer(buf, name_of, align)}
        for i, buf in enumerate(buffers)
    ]
    return {
        "applicable": align is not None,
        "buffers": reports,
        "unaligned_total": sum(len(r["issues"]) for r in reports),
    }
