"""`parity token create`: make an API token; the secret is printed once and only its hash is stored."""

from __future__ import annotations

import argparse

from service.commands.common import ready_database
from service.tokens import SCOPES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="API tokens")
    tsub = p.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="create a token and print it")
    create.add_argument("--name", required=True, help="who or what uses it, e.g. ci-main")
    create.add_argument("--scope", action="append", choices=SCOPES, required=True, help="repeatable")
    create.set_defaults(func=create_token)


def create_token(args: argparse.Namespace) -> int:
    from service.db import session_scope
    from service.tokens import create_token as make

    ready_database(migrate=False)
    with session_scope() as session:
        secret = make(session, name=args.name, scopes=args.scope)
    print(secret)
    return 0
