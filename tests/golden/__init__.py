"""Golden phase documents captured from real runs: a DP 2 run known-good and known-bad (capture.py), and
resumes that lose a tensor in each way a cause names (`causes/<case>`, capture_causes.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, cast

from jobs.contract import PhaseDocument

HERE = Path(__file__).resolve().parent
CASES = ("bad", "good")


def documents(case: str) -> dict[str, PhaseDocument]:
    """{phase name: merged phase document} of one captured run (a fresh copy each call)."""
    docs = {p.stem: json.loads(p.read_text()) for p in sorted((HERE / case).glob("*.json"))
            if p.stem not in ("expected", "spec")}
    docs |= {p.name.removesuffix(".json.gz"): json.loads(gzip.decompress(p.read_bytes()))
             for p in sorted((HERE / case).glob("*.json.gz"))}
    return cast(dict[str, PhaseDocument], docs)


def expected(case: str) -> dict[str, Any]:
    """The verdict fields the capture produced, and the run's spec (a `causes/` case: the spec only)."""
    if not (HERE / case / "expected.json").exists():
        return {"spec": json.loads((HERE / case / "spec.json").read_text())}
    return cast(dict[str, Any], json.loads((HERE / case / "expected.json").read_text()))
