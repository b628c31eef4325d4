"""One label for a verdict on every surface: the run page, the config page, the overview and the API word a
known failure, a worked-around pass and a regression alike (service/core/verdicts.run_label); and the finished
run states are named once (service/core/state_names.py), not spelled out in other modules."""

from __future__ import annotations

import ast
import html

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from models import Environment, Run
from service.core.state_names import FINISHED_RUN_STATES
from tests.plugins.seed import spec, summary
from tests.plugins.source_scan import ROOT, docstring_ids, offenders

KNOWN = {"id": 3, "signature": "adam-step-not-restored", "link": "https://example.test/bug/3"}


@pytest.mark.parametrize(("fields", "expected"), [
    ({"verdict": "known-failure", "state": "failed", "signatures": ["adam-step-not-restored"],
      "summary": {**summary("0.16.1"), "known_failures": [KNOWN]}},
     "known-failure (known upstream bug: adam-step-not-restored)"),
    ({"verdict": "pass", "summary": {**summary("0.16.1"), "worked_around_by": {"restore-adam-step": [
        "adam-step-not-restored"]}}}, "pass (worked around: restore-adam-step)"),
    ({"verdict": "fail", "state": "failed", "regression": True, "compared_track": "main"},
     "fail (regression on main)"),
])
def test_every_surface_shows_the_same_label(client: TestClient, db_session: Session, fields: dict,
                                            expected: str) -> None:
    env = Environment(name="mcore-0.16.1", python="/usr/bin/python3", state="ready", megatron_core="0.16.1")
    db_session.add(env)
    db_session.flush()
    values = {"config": "moe-fp32-router", "state": "passed", "labels": {"branch": "main"}, "signatures": [],
              "spec": spec(), **fields}
    run = Run(environment_id=env.id, **values)
    db_session.add(run)
    run.finished_at = run.created_at
    db_session.flush()
    run_id = run.id
    api = client.get(f"/api/v1/runs/{run_id}").json()
    assert api["reading"]["label"] == expected
    for page in (f"/runs/{run_id}", "/configs/moe-fp32-router", "/"):
        body = html.unescape(client.get(page).text)
        assert expected in body, (page, expected)


def _spelled_out(source: str) -> list[str]:
    tree = ast.parse(source)
    prose = docstring_ids(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)) and id(node) not in prose:
            names = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if len(names & FINISHED_RUN_STATES) >= 3:
                hits.append(f"line {node.lineno}: {ast.unparse(node)}")
    return hits


def test_the_finished_states_are_named_once() -> None:
    assert offenders(_spelled_out, ROOT / "service" / "core" / "state_names.py") == {}
    assert _spelled_out('DONE = ("passed", "failed", "error", "cancelled")')
