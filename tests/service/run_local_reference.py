"""run-local's phase documents of a spec, as the reference a scheduler-run document is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PHASES = ("train_and_save", "resume")


@dataclass(frozen=True)
class LocalReference:
    """What run-local wrote for one spec: its verdict and each phase's document (attempt 1)."""

    verdict: str
    documents: dict[str, Any]
