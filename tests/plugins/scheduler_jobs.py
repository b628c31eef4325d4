"""Tiny job payloads and phase documents for scheduler tests that need real jobs but not Megatron.

The payloads run as real submitit jobs (local processes or Slurm); they import nothing heavy. The
documents are the golden known-good ones (tests/golden), with a NaN loss at step 5 on both sides
and an infinite wall time, which a rank can really return.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tests.golden import documents, expected

SPEC: dict[str, Any] = {**expected("good")["spec"], "isolation": "job"}  # one job per phase, as submitted here


def phase_doc(phase: str, **info: Any) -> dict[str, Any]:
    """The golden known-good document of `phase`, with NaN/Infinity in it and `info` merged into its info."""
    doc: dict[str, Any] = dict(documents("good")[phase])  # type: ignore[arg-type]
    doc["steps"] = [dict(s, loss=math.nan) if s["step"] == 5 else dict(s) for s in doc["steps"]]
    doc["steps"][-1]["wall_s"] = math.inf
    doc["info"] = {**doc["info"], **info}
    return doc


def write_document(attempt_folder: str, doc: dict[str, Any]) -> None:
    """Job payload: leave the given document as this rank's result file, as a real rank does."""
    import json
    from pathlib import Path

    import submitit

    rank = submitit.JobEnvironment().global_rank
    (Path(attempt_folder) / f"result.rank{rank}.json").write_text(json.dumps({**doc, "rank": rank}))


def sleep_forever(marker: str) -> None:
    """Job payload: note this process's pid in `marker`, then sleep until killed."""
    import os

    with open(marker, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    while True:
        time.sleep(1)


def fail_rendezvous(attempt_folder: str, doc: dict[str, Any]) -> None:
    """Job payload: rank 0's rendezvous finds its port taken (as the review's squatter made it), for real, and
    the rank writes the error document a rank writes for a failure in its import stage."""
    import json
    import socket
    from pathlib import Path

    import submitit
    import torch

    from jobs.contract import exception_record

    rank = submitit.JobEnvironment().global_rank
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        try:
            torch.distributed.TCPStore("127.0.0.1", squatter.getsockname()[1], is_master=True, wait_for_workers=False)
            error = None
        except Exception as exc:  # noqa: BLE001 - whatever torch raises is what the rank records
            error = exception_record(exc, "import", rank)
    out = {**doc, "rank": rank, "status": "error", "error": error}
    (Path(attempt_folder) / f"result.rank{rank}.json").write_text(json.dumps(out))
