"""Golden phase documents captured from a real DP 2 run (see capture.py): the contract's fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from jobs.contract import PhaseDocument

HERE = Path(__file__).resolve().parent
CASES = ("bad", "good")


def documents(case: str) -> dict[str, PhaseDocument]:
    """{phase name: merged phase document} of one captured run (a fresh copy each call)."""
    return {p.stem: cast(PhaseDocument, json.loads(p.read_text())) for p in sorted((HERE / case).glob("*.json"))
            if p.stem != "expected"}


def expected(case: str) -> dict[str, Any]:
    """The verdict fields the capture produced, and the run's spec."""
    return cast(dict[str, Any], json.loads((HERE / case / "expected.json").read_text()))
