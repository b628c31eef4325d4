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
HEAVY_MARKS = ("megatron", "slurm", "browser", "slow", "job_user", "engine")
# the session's run-local references are made once per worker: every reader on the one "jobs" worker
HEAVY_FIXTURES = frozenset({"run_local_reference"})
POSTGRES_FIXTURES = frozenset({"database_url", "settings_env", "db_session", "committed_db", "client", "live_api"})


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the database as `postgres` and every test of a module that runs jobs as the
    job user (it imports tests.plugins.job_user) as `job_user`; leave out `nightly` unless -m names it."""
    from tests.plugins import job_user

    for item in items:
        if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
        if ENGINE_MISSING and item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.skip(reason="needs torch and Megatron-Core: scripts/setup.sh, not --no-engine"))
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "require_job_user", None) is job_user.require_job_user:
            item.add_marker(pytest.mark.job_user)
        # Under pytest-xdist (--dist loadgroup: scripts/test.sh) everything that runs real jobs, Slurm or a
        # browser stays on one worker, in order, sharing its session's run-local references; the other
        # worker takes the tests that need only Postgres.
        fixtures = set(getattr(item, "fixturenames", ()))
        if any(item.get_closest_marker(m) for m in HEAVY_MARKS) or HEAVY_FIXTURES & fixtures:
            item.add_marker(pytest.mark.xdist_group("jobs"))
    # The nightly tier carries what the PR tier covers with a representative slice (each nightly test
    # names its slice): `-m nightly` (scripts/test.sh --nightly) runs it, any other run leaves it out.
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
