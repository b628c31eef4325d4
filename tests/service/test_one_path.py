"""No production branch for tests, one path for runs: service/ holds no `dependency_overrides` lookup, no
`isinstance(..., Connection)` special case (a session bound to a test's connection) and no raw SQL
writing runs; tests get a database of their own and the app's own sessions (tests/plugins/database.py)."""

from __future__ import annotations

import ast
import re

from tests.plugins.source_scan import ROOT, offenders


def _test_branches(source: str) -> list[str]:
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "dependency_overrides":
            hits.append(f"line {node.lineno}: dependency_overrides")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                and len(node.args) == 2 and "Connection" in ast.unparse(node.args[1]).split(".")[-1]):
            hits.append(f"line {node.lineno}: {ast.unparse(node)}")
    return hits


def _raw_run_writes(source: str) -> list[str]:
    return [f"INSERT INTO {m.group(1)}" for m in re.finditer(r"INSERT\s+INTO\s+(runs|run_events)\b", source, re.I)]


def test_service_has_no_branch_for_tests() -> None:
    assert offenders(_test_branches, ROOT) == {}


def test_the_scan_finds_what_it_looks_for() -> None:
    # the scan itself, on what it must refuse: without this a scan that matched nothing would pass too
    sample = ("def f(app, bind):\n    if get_session in app.dependency_overrides:\n        pass\n"
              "    return isinstance(bind, Connection) or isinstance(bind, sqlalchemy.engine.Connection)\n")
    assert len(_test_branches(sample)) == 3
    assert _raw_run_writes("x = text('INSERT INTO runs (id) VALUES (1)')") == ["INSERT INTO runs"]


def test_runs_are_written_only_through_the_orm() -> None:
    assert offenders(_raw_run_writes, ROOT) == {}
    assert not (ROOT / "service" / "runs" / "group_commit.py").exists()
