"""The test suite's hooks: which tiers a run takes, and the shared harness registered as plugins.

The fixtures and helpers every folder shares live in tests/plugins/ (the database, the served app, the
browser, Slurm, the scheduler harness, run-local references); test files import helpers from there and
never from one another.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.plugins.database",
    "tests.plugins.server",
    "tests.plugins.browser",
    "tests.plugins.slurm",
    "tests.plugins.run_local",
]

# The periodic detector-health batch would queue Megatron runs behind every scheduler test;
# tests that exercise it turn it on themselves.
os.environ.setdefault("PARITY_SELFTEST_INTERVAL_HOURS", "0")
# Test receivers listen on 127.0.0.1; tests/security/test_notify_destinations.py turns this off to
# show internal addresses refused by default.
os.environ.setdefault("PARITY_NOTIFY_ALLOW_PRIVATE", "1")

# Fixtures that reach the Postgres server: a test using any of them is marked `postgres`
# (`pytest -m "not postgres"` runs what needs nothing at all).
POSTGRES_FIXTURES = frozenset({"database_url", "template_database", "test_database_url", "settings_env", "db_session",
                               "committed_db", "client", "live_api"})


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test as it is collected (before any -m selection or other plugin's modifyitems reads the
    marks): `postgres` when it uses a database fixture, `job_user` when its module runs jobs as the job
    user (it imports tests.plugins.job_user); without the engine installed, an `engine` test is skipped."""
    from tests.plugins import job_user

    if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.postgres)
    module = getattr(item, "module", None)
    if module is not None and getattr(module, "require_job_user", None) is job_user.require_job_user:
        item.add_marker(pytest.mark.job_user)
    if ENGINE_MISSING and item.get_closest_marker("engine"):
        item.add_marker(pytest.mark.skip(reason="needs torch and Megatron-Core: scripts/setup.sh, not --no-engine"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The nightly tier carries what the PR tier covers with a representative slice (each nightly test names
    its slice): `-m nightly` (scripts/test.sh --nightly) runs it, any other run leaves it out."""
    if "nightly" not in (config.getoption("markexpr") or ""):
        nightly = [item for item in items if item.get_closest_marker("nightly")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("nightly")]


# Without the engine extra (scripts/setup.sh --no-engine: the fast lane), a module that imports torch,
# Megatron or the rank-side code cannot even be collected: it is left out, not an error.
ENGINE_ROOTS = ("torch", "megatron", "numpy", "jobs.rank")
ENGINE_MISSING = importlib.util.find_spec("torch") is None


def _needs_engine(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        if any(n == root or n.startswith(root + ".") for n in names for root in ENGINE_ROOTS):
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if ENGINE_MISSING and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return _needs_engine(collection_path) or None
    return None
