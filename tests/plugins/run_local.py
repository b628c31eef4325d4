"""run-local's result and phase documents of a spec: run once per session (tests/conftest.py's
run_local_reference), read by every test that runs that spec through run-local or compares a
scheduler run's documents with run-local's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture(scope="session")
def run_local_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Any]], LocalReference]:
    """run-local of a spec, once per session: tests/jobs' known-good DP 2 and reshard runs are the
    references tests/service/test_protocol_equality.py compares the scheduler's runs with, and the
    warm-pool walk its warm run (the same specs: run-local runs each once for all of them)."""
    import json

    from jobs.launch.local import run_parity
    from jobs.spec import RunSpec

    done: dict[str, LocalReference] = {}

    def reference(fields: dict[str, Any]) -> LocalReference:
        spec = RunSpec.from_dict(fields)
        key = json.dumps(spec.to_dict(), sort_keys=True)
        if key not in done:
            folder = tmp_path_factory.mktemp("run-local")
            done[key] = LocalReference(run_parity(spec, folder), folder)
        return done[key]

    return reference
