"""Findings in sentences: each signature's evidence summarised as one generated sentence.

Which tensors, on which ranks, and how they changed — zeroed, scaled, swapped, shifted — read from
the fingerprints (numel, sum, abs_sum before and after) the probes recorded; the raw rows stay below
the sentence, collapsed.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

MAX_NAMES = 4


def _close(a: float, b: float, rel: float = 1e-4) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def how_changed(before: Any, after: Any, others: dict[tuple[Any, Any], str] | None = None) -> str:
    """One word (or a few) for how a tensor's fingerprint changed: zeroed, scaled ×k, swapped with X, shifted."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return "missing after load" if before and not after else "changed"
    values = (before.get("sum"), before.get("abs_sum"), after.get("sum"), after.get("abs_sum"))
    if any(not isinstance(v, (int, float)) for v in values):
        return "changed"
    bs, ba, as_, aa = (float(v or 0) for v in values)
    if aa == 0 and ba != 0:
        return "zeroed"
    if others and (as_, aa) in others:
        return f"swapped with {others[(as_, aa)]}"
    if ba and bs and _close(aa / ba, as_ / bs):
        return f"scaled ×{aa / ba:.4g}"
    numel = after.get("numel") or before.get("numel") or 0
    if numel and _close(as_ - bs, aa - ba, 1e-3):
        return f"shifted by {(as_ - bs) / numel:+.3g} per element"
    return "changed"


def _rows_of(evidence: Any, rank: Any = None) -> list[dict[str, Any]]:
    """Every (rank, tensor) item anywhere in a signature's evidence (a rank given by an enclosing item counts)."""
    out: list[dict[str, Any]] = []
    if isinstance(evidence, dict):
        rank = evidence.get("rank", rank)
        name = evidence.get("name") or evidence.get("param")
        if isinstance(name, str):
            out.append({**evidence, "rank": rank, "name": name})
        for key, value in evidence.items():
            if key == "lost":  # the same items again, classified for the cause line (shown above the sentence)
                continue
            out += _rows_of(value, rank)
    elif isinstance(evidence, list):
        for value in evidence:
            out += _rows_of(value, rank)
    return out


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES])
    return shown + (f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    return (" on rank " if len(ranks) == 1 else " on ranks ") + ", ".join(map(str, ranks))


def fingerprint_hows(rows: list[dict[str, Any]]) -> dict[str, str]:
    """From fingerprint probe rows ({param, key, rank, before, after}): 'param/key' -> how it changed."""
    befores: dict[int, dict[tuple[Any, Any], str]] = defaultdict(dict)
    for r in rows:
        b = r.get("before")
        if isinstance(b, dict) and b.get("sum") is not None:
            befores[r.get("rank", 0)][(b["sum"], b.get("abs_sum"))] = f"{r.get('param')}/{r.get('key')}"
    out: dict[str, str] = {}
    for r in rows:
        name = f"{r.get('param')}/{r.get('key')}"
        others = {k: v for k, v in befores[r.get("rank", 0)].items() if v != name}
        out.setdefault(name, how_changed(r.get("before"), r.get("after"), others))
    return out


def sentence(title: str, evidence: Any, hows: dict[str, str]) -> str | None:
    """One sentence: which tensors, which ranks, how — or None when the evidence names no tensor."""
    items = _rows_of(evidence)
    if not items:
        return None
    names = list(dict.fromkeys(str(i.get("name") or i.get("param")) for i in items))
    ranks = sorted({int(i["rank"]) for i in items if isinstance(i.get("rank"), int)})
    total = evidence.get("count") or evidence.get("misaligned_total") if isinstance(evidence, dict) else None
    count = max(int(total or 0), len(names))
    by_how: dict[str, list[str]] = defaultdict(list)
    example: dict[str, str] = {}
    for n in names:
        # a restore finding names "param/exp_avg"; a fingerprint row names the param and key
        how = hows.get(n) or next((h for k, h in hows.items() if k.startswith(n + "/") or n.startswith(k)), None)
        if how and how.startswith("swapped with "):  # one kind, one example: not a swap partner per tensor
            example.setdefault("swapped", f"{n} holds {how.removeprefix('swapped with ')}'s values")
            how = "swapped with another tensor's state"
        by_how[how or ""].append(n)
    parts = []
    for how, group in sorted(by_how.items(), key=lambda item: -len(item[1])):
        verb = "is" if len(group) == 1 else "are"
        text = f"{_names(group)} {verb} {how}" if how else _names(group)
        if how.startswith("swapped") and "swapped" in example:
            text += f" (e.g. {example['swapped']})"
        parts.append(text)
    what = "; ".join(parts)
    noun = "tensor" if len(names) == 1 else "tensors"
    more = f" ({count} differences in all)" if count > len(names) else ""
    return f"{title}: {len(names)} {noun}{_ranks(ranks)}{more} — {what}."


SIZE_ASSERT = re.compile(r"\(torch\.Size\(\[([\d, ]*)\]\), (\d+), (\d+)\)")


def explain_crash(message: str | None) -> str | None:
    """A sentence for crashes whose own message says little (a bare AssertionError of sizes)."""
    match = SIZE_ASSERT.search(message or "")
    if not match:
        return None
    shape, offset, expected = match.groups()
    return (f"The save checks that each optimizer-state shard fits its parameter and found a tensor of shape "
            f"[{shape}] at offset {offset} where {expected} elements belonged: the optimizer state sits on the "
            f"wrong parameter (a misaligned index), so the checkpoint was never written and the resume never ran.")


def fingerprint_summary(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per way the fingerprint rows changed: which state (exp_avg, param, …) of how many
    parameters, on which ranks, e.g. "exp_avg, exp_avg_sq of 17 parameters on rank 0 are scaled ×1.001"."""
    hows = fingerprint_hows(rows)
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"keys": set(), "params": set(), "ranks": set()})
    for r in rows:
        how = hows.get(f"{r.get('param')}/{r.get('key')}", "changed")
        how = "swapped with another tensor" if how.startswith("swapped") else how
        g = groups[how]
        g["keys"].add(str(r.get("key")))
        g["params"].add(str(r.get("param")))
        if isinstance(r.get("rank"), int):
            g["ranks"].add(r["rank"])
    out = []
    for how, g in sorted(groups.items(), key=lambda item: -len(item[1]["params"])):
        n = len(g["params"])
        params = f"{n} parameter{'s' if n != 1 else ''}" if n > 2 else " and ".join(sorted(g["params"]))
        out.append(f"{', '.join(sorted(g['keys']))} of {params}{_ranks(sorted(g['ranks']))} "
                   f"{'is' if n == 1 else 'are'} {how}.")
    return out
