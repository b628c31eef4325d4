"""Two launches' phase documents side by side: what legitimately differs between them masked out, and
every place the rest differs (the warm/cold and run-local/scheduler equality tests)."""

from __future__ import annotations

from typing import Any

# What legitimately differs between two launches of the same plan: clocks, folders, job ids, hosts.
VOLATILE = ("seconds", "wall", "time", "folder", "path", "job_id", "pid", "port", "started", "submitit", "node",
            "memory", "rss", "bytes")  # a checkpoint's size on disk includes its own path


def comparable(value: Any) -> Any:
    """The document without what differs between two launches (timings, paths, ids)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if not any(word in k.lower() for word in VOLATILE)}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, str) and ("/tmp/" in value or "/runs/" in value):
        return "<path>"
    return value


def differences(a: Any, b: Any, where: str = "") -> Any:
    """Each place two documents differ: (path, scheduler's value, run-local's value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                yield f"{where}/{key}", a.get(key, "<absent>"), b.get(key, "<absent>")
            else:
                yield from differences(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{where}[{index}]")
    elif a != b:
        yield where, a, b
