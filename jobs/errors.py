"""Rank error records, de-duplicated: one record per distinct error, with the ranks that raised it.

Used by every document that carries errors (a rank's phase document, the merged phase document,
the verdict), so a failure seen by all ranks is one traceback, not one per rank per level.
"""

from __future__ import annotations

from typing import Any, cast

from jobs.contract import ErrorRecord

NESTED = ("rank_errors", "all_ranks")


def _key(err: ErrorRecord) -> tuple[Any, ...]:
    return (err.get("type"), err.get("stage"), err.get("message"))


def _flatten(errors: list[ErrorRecord]) -> list[ErrorRecord]:
    out = []
    for err in errors:
        out.append(err)
        for key in NESTED:
            out += _flatten(cast(list[ErrorRecord], err.get(key) or []))
    return out


def dedupe_errors(errors: list[ErrorRecord]) -> list[ErrorRecord]:
    """Merge error records (also those nested in `rank_errors` / `all_ranks`) by (type, stage, message).

    Each result keeps the first traceback seen and lists `ranks` (sorted); order is first-seen.
    """
    merged: dict[tuple[Any, ...], ErrorRecord] = {}
    for err in _flatten(errors):
        rank = err.get("rank")
        ranks = set(err.get("ranks") or []) | ({rank} if rank is not None else set())
        record = merged.get(_key(err))
        if record is None:
            record = cast(ErrorRecord, {k: v for k, v in err.items() if k not in NESTED})
            merged[_key(err)] = record
        record["ranks"] = sorted(set(record.get("ranks") or []) | ranks)
        if not record.get("traceback") and err.get("traceback"):
            record["traceback"] = err["traceback"]
    return list(merged.values())


def with_rank_errors(root: ErrorRecord, errors: list[ErrorRecord]) -> ErrorRecord:
    """Return `root` (with the ranks that raised it) whose `rank_errors` lists every distinct error once.

    `rank_errors` follows the contract (every rank's own record), de-duplicated: an error all ranks
    raised is one record naming them all; the traceback is kept once, on the root (the records
    in `rank_errors` carry an empty one).
    """
    distinct = dedupe_errors([root, *errors])
    others: list[ErrorRecord] = [{**e, "traceback": ""} for e in distinct]
    return {**distinct[0], "rank_errors": others}
