"""Fixtures shared by the service tests that run real Megatron-Core."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from jobs.launch.local import run_parity
from jobs.protocol import RunPlan
from jobs.spec import RunSpec
from tests.service.run_local_reference import PHASES, LocalReference


@pytest.fixture(scope="session")
def run_local_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Any]], LocalReference]:
    """run-local's documents of a spec, run once per session: the protocol-equality test compares the
    scheduler's cold run with them, the warm-pool walk its warm run (the same spec: one run-local for both)."""
    cache: dict[str, LocalReference] = {}

    def reference(fields: dict[str, Any]) -> LocalReference:
        spec = RunSpec.from_dict(fields)
        key = json.dumps(spec.to_dict(), sort_keys=True)
        if key not in cache:
            folder = tmp_path_factory.mktemp("run-local")
            result = run_parity(spec, folder)
            plan = RunPlan.of(spec)
            documents = {}
            for phase in PHASES:
                doc, refused = plan.collect(plan.attempt_folder(folder, phase, 1), phase)
                assert doc is not None and not refused, (phase, refused)
                documents[phase] = doc
            cache[key] = LocalReference(str(result["verdict"]), documents)
        return cache[key]

    return reference
