"""run-local's result and phase documents of a spec: run once per session (tests/conftest.py's
run_local_reference), read by every test that runs that spec through run-local or compares a
scheduler run's documents with run-local's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

PHASES = ("train_and_save", "resume")


@dataclass(frozen=True)
class LocalReference:
    """What run-local returned and wrote for one spec."""

    result: Any  # jobs.contract.ParityResult (not imported here: the fast lane imports no engine)
    folder: Path

    @property
    def verdict(self) -> str:
        return str(self.result["verdict"])

    def document(self, phase: str) -> Any:
        """The phase's document (attempt 1), as the scheduler would collect it."""
        from jobs.protocol import RunPlan

        plan = RunPlan.of(self.result["spec"])
        doc, refused = plan.collect(plan.attempt_folder(self.folder, phase, 1), phase)
        assert doc is not None and not refused, (phase, refused)
        return doc
