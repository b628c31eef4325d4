"""`parity serve`: the REST API and dashboard."""

from __future__ import annotations

import argparse
from typing import Any

from service.cli.common import load_settings, ready_database
from service.core.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the REST API and dashboard")
    p.add_argument("--host", help="bind address (default PARITY_API_HOST)")
    p.add_argument("--port", type=int, help="port (default PARITY_API_PORT)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (one per core suits a busy CI)")
    p.add_argument("--access-log", action="store_true",
                   help="log every request (off by default: it costs about a tenth of a small request's CPU)")
    p.add_argument("--migrate", action="store_true", help="run `db upgrade` first (implied for embedded Postgres)")
    p.set_defaults(func=run)


def server_options(settings: Settings, **options: Any) -> dict[str, Any]:
    """uvicorn's options: its proxy-header handling is off, always.

    With it on (uvicorn's default, trusting 127.0.0.1) the client's own X-Forwarded-For replaced
    request.client.host before the dashboard compared it with PARITY_PROXY_ADDRESSES, so anyone
    could name the proxy's address and then send the trusted user header. The dashboard checks the
    real peer itself (service/web/dashboard/auth.py); links use PARITY_PUBLIC_URL, not Host headers.
    """
    return {**options, "proxy_headers": False, "forwarded_allow_ips": ""}


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from service.core.links import record_serving
    from service.web.app import create_app

    settings = load_settings()
    ready_database(migrate=args.migrate or not settings.database_url)
    host, port = args.host or settings.api_host, args.port or settings.api_port
    # links in notifications (written by the scheduler, which never sees a request) use this address
    record_serving(settings, host, port)
    # one set of server options whatever the worker count, so a benchmark of 1 and of N compares like with like
    options = server_options(settings, host=host, port=port, access_log=args.access_log)
    if args.workers > 1:
        # workers re-create the app in their own processes; they share the database, nothing else
        uvicorn.run("service.web.app:create_app", factory=True, workers=args.workers, **options)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(), **options)  # type: ignore[arg-type]
    return 0
