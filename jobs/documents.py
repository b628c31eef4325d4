"""Per-rank result documents of one phase, and the one document that speaks for the phase."""

from __future__ import annotations

import re

from jobs.contract import ErrorRecord, PhaseDocument
from jobs.errors import dedupe_errors, with_rank_errors

# Errors a rank sees because a peer died: the peer's own error is the root cause.
_PEER_FAILURE = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|StageTimeout|timed out", re.I)


def _is_secondary(error: ErrorRecord) -> bool:
    return bool(_PEER_FAILURE.search(f"{error.get('type', '')} {error.get('message', '')}"))


def rank_nodes(docs: list[PhaseDocument]) -> list[str | None] | None:
    """Each rank's node (hostname), indexed by rank; None when no document names its node."""
    named = {d["rank"]: d["node"] for d in docs if isinstance(d.get("rank"), int) and d.get("node")}
    if not named:
        return None
    return [named.get(rank) for rank in range(max(named) + 1)]


def merge_rank_documents(docs: list[PhaseDocument]) -> PhaseDocument | None:
    """Return rank 0's document, carrying the root-cause error of whichever rank failed first.

    `rank_errors` lists each failing rank's own record once: ranks that agreed on a failure already
    carry the agreed list, so it is flattened rather than nested.
    """
    if not docs:
        return None
    main = next((d for d in docs if d.get("rank") == 0), docs[0])
    nodes = rank_nodes(docs)
    if nodes is not None:
        main = {**main, "rank_nodes": nodes}
    errors = dedupe_errors([e for d in docs if d.get("status") == "error" and (e := d.get("error"))])
    if errors:
        root = next((e for e in errors if not _is_secondary(e)), errors[0])
        main = {**main, "status": "error", "error": with_rank_errors(root, errors)}
    return main
