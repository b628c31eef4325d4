"""Whose a failed environment is decides how its runs end (service/runs/import_check.py): megatron.core that does not
import is the build's answer (the check fails, `build-import-crash`, exit 1); an install or a torch that failed is the
service's (`error`, "couldn't tell", exit 2, counted toward the infrastructure streak)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from models import Environment, Run
from service.environments.registry import IMPORT_CHECK
from service.runs.import_check import IMPORT_FAILURE_WHOSE, _error, fail_runs_on_failed_builds

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 4, "save_step": 2}
BOOM = "RuntimeError: this build cannot be imported"


@pytest.mark.parametrize(("whose", "state", "verdict", "signatures"), [
    ("build", "failed", "fail", ["build-import-crash"]),
    ("service", "error", None, []),
])
def test_a_failed_environments_queued_run_ends_as_whose_the_failure_is(
    client: TestClient, db_session: Session, make_token, whose: str, state: str, verdict: str | None,
    signatures: list[str],
) -> None:
    run_id = client.post("/api/v1/runs", json={"spec": SPEC}, headers=make_token("submit")).json()["id"]
    run = db_session.get(Run, run_id)
    assert run is not None
    env = db_session.get(Environment, run.environment_id)
    assert env is not None
    env.state, env.error_message = "failed", f"importing torch and megatron.core failed: import megatron.core: {BOOM}"
    env.packages = {**(env.packages or {}), IMPORT_CHECK: "failed", IMPORT_FAILURE_WHOSE: whose}
    assert fail_runs_on_failed_builds(db_session) == 1
    db_session.commit()
    db_session.refresh(run)
    assert (run.state, run.verdict, run.signatures or []) == (state, verdict, signatures)
    assert BOOM in (run.error_message or "")
    if verdict:
        assert BOOM in run.summary["cause_lines"]["build-import-crash"]


class _Report:
    def __init__(self, error: str) -> None:
        self.ok, self.error, self.torch = False, error, None


@pytest.mark.parametrize(("error", "builds"), [
    ("import megatron.core: ModuleNotFoundError: No module named 'megatron.core.foo'", True),
    ("import torch: OSError: libcudart.so.13: cannot open shared object file", False),
    ("import torch: ImportError: x; import megatron.core: ImportError: y", False),
])
def test_only_megatron_core_that_does_not_import_is_the_builds(error: str, builds: bool) -> None:
    env = Environment(name="e", python="python", packages={}, torch="2.13.0")
    worker = type("W", (), {"name": "e1-t1"})()
    message, whose = _error(env, worker, [_Report(error)])  # type: ignore[arg-type, list-item]
    assert message is not None and error in message and whose is builds
