"""`parity token create | list | revoke`: API tokens; a secret is printed once and only its hash is stored."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

from service.cli.common import ready_database
from service.core.tokens import SCOPES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="API tokens")
    tsub = p.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="create a token and print it")
    create.add_argument("--name", required=True, help="who or what uses it, e.g. ci-main (the run's requester)")
    create.add_argument("--scope", action="append", choices=SCOPES, required=True, help="repeatable")
    create.add_argument("--track", action="append", default=[], metavar="PATTERN",
                        help="a track (branch label) its runs may write, an fnmatch pattern: 'pr-*', 'main', '*' "
                             "(repeatable; required with --scope submit unless admin)")
    create.add_argument("--expires-days", type=float, default=None, help="expire after this many days (default: never)")
    create.set_defaults(func=create_token)
    listing = tsub.add_parser("list", help="every token: id, name, scopes, tracks, dates, revoked")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(func=list_tokens)
    revoke = tsub.add_parser("revoke", help="revoke a token by id (see `parity token list`)")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(func=revoke_token)


def create_token(args: argparse.Namespace) -> int:
    from service.core.db import session_scope
    from service.core.tokens import create_token as make

    if args.expires_days is not None and args.expires_days <= 0:
        raise SystemExit("--expires-days: must be > 0")
    ready_database(migrate=False)
    expires = timedelta(days=args.expires_days) if args.expires_days is not None else None
    with session_scope() as session:
        try:
            secret = make(session, name=args.name, scopes=args.scope, tracks=args.track, expires_in=expires)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    print(secret)
    return 0


def _when(value: object) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None  # type: ignore[attr-defined]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return ",".join(value) if isinstance(value, list) else str(value)


def list_tokens(args: argparse.Namespace) -> int:
    from service.core.db import session_scope
    from service.core.tokens import list_tokens as rows

    ready_database(migrate=False)
    with session_scope() as session:
        tokens = [
            {"id": t.id, "name": t.name, "scopes": list(t.scopes), "tracks": list(t.tracks or []),
             "created_at": _when(t.created_at),
             "expires_at": _when(t.expires_at), "last_used_at": _when(t.last_used_at),
             "revoked_at": _when(t.revoked_at)}
            for t in rows(session)
        ]
    if args.json:
        print(json.dumps(tokens, indent=2))
        return 0
    columns = ("id", "name", "scopes", "tracks", "created_at", "expires_at", "last_used_at", "revoked_at")
    table = [[_cell(t[c]) for c in columns] for t in tokens]
    widths = [max(len(c), *(len(r[i]) for r in table)) if table else len(c) for i, c in enumerate(columns)]
    for row in [list(columns), *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def revoke_token(args: argparse.Namespace) -> int:
    from service.core.db import session_scope
    from service.core.tokens import revoke_token as revoke

    ready_database(migrate=False)
    with session_scope() as session:
        try:
            row = revoke(session, token_id=args.id)
        except LookupError as exc:
            raise SystemExit(str(exc)) from None
        print(f"revoked token {row.id} ({row.name}) at {_when(row.revoked_at)}")
    return 0
