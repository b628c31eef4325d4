"""`parity db upgrade`: migrate the configured (or embedded) database to the latest schema."""

from __future__ import annotations

import argparse

from service.cli.common import ready_database


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="database schema")
    dbsub = p.add_subparsers(dest="db_command", required=True)
    up = dbsub.add_parser("upgrade", help="alembic upgrade head")
    up.set_defaults(func=upgrade)


def upgrade(_: argparse.Namespace) -> int:
    url = ready_database(migrate=True)
    from sqlalchemy import make_url

    print(f"database at head: {make_url(url).render_as_string(hide_password=True)}")
    return 0
