"""The test suite's hooks: which tiers a run takes, and the shared harness registered as plugins.

The fixtures and helpers every folder shares live in tests/plugins/ (the database, the served app, the
browser, Slurm, the scheduler harness, run-local references); test files import helpers from there and
never from one another.
"""

from __future__ import annotations

import os

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
POSTGRES_FIXTURES = frozenset({"database_url", "settings_env", "db_session", "committed_db", "client", "live_api"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the database as `postgres` and every test of a module that runs jobs as the
    job user (it imports tests.plugins.job_user) as `job_user`; leave out `nightly` unless -m names it."""
    from tests.plugins import job_user

    for item in items:
        if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "require_job_user", None) is job_user.require_job_user:
            item.add_marker(pytest.mark.job_user)
    # The nightly tier carries what the PR tier covers with a representative slice (each nightly test
    # names its slice): `-m nightly` (scripts/test.sh --nightly) runs it, any other run leaves it out.
    if "nightly" not in (config.getoption("markexpr") or ""):
        nightly = [item for item in items if item.get_closest_marker("nightly")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("nightly")]
