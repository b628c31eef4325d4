"""Fixtures shared by the service tests."""

from __future__ import annotations

import pytest

from tests.plugins.client_venv import ClientVenv, install_base_client


@pytest.fixture(scope="session")
def base_client(tmp_path_factory: pytest.TempPathFactory) -> ClientVenv:
    """This checkout's base install (the client) in a fresh venv, built once a session: the client-install
    test and the CI-jobs walk only run it (neither installs into it)."""
    client = install_base_client(tmp_path_factory.mktemp("client"))
    print(f"base client install: {client.install_s} s, {client.added_bytes / 1e6:.1f} MB over an empty venv")
    return client
