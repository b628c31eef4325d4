"""`parity scheduler`: the submitter + reconciler loop (run one or several replicas)."""

from __future__ import annotations

import argparse
import signal
import threading

from service.cli.common import load_settings, ready_database


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scheduler", help="claim queued runs, submit phases through submitit, collect results")
    p.add_argument("--once", action="store_true", help="do one pass and exit")
    p.add_argument("--migrate", action="store_true", help="run `db upgrade` first (implied for embedded Postgres)")
    p.add_argument("--check", action="store_true",
                   help="health check: exit 0 when a scheduler on this host wrote a heartbeat in the last minute")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.core.links import warn_if_unknown
    from service.scheduler.loop import decide_executor, heartbeat, replica_name, run_forever, tick

    settings = load_settings()
    if args.check:
        return check_heartbeat()
    ready_database(migrate=args.migrate or not settings.database_url)
    executor = decide_executor(settings)  # once: `auto` never flips to local processes later
    print(f"scheduler: executor {executor}, run folder {settings.resolved_run_folder}", flush=True)
    warn_if_unknown(settings, "scheduler")
    if args.once:
        heartbeat(replica_name(), executor)
        print(tick(settings, executor=executor))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_forever(settings, stop, executor)
    return 0


def check_heartbeat(max_age_s: float = 60.0) -> int:
    """0 when a replica on this host (host:pid) beat within max_age_s, else 1 (a container health check)."""
    import socket
    from datetime import timedelta

    from sqlalchemy import func, select

    from models import SchedulerHeartbeat
    from models.base import utcnow
    from service.core.db import session_scope

    ready_database(migrate=False)
    with session_scope() as session:
        seen = session.scalar(
            select(func.max(SchedulerHeartbeat.seen_at)).where(SchedulerHeartbeat.name.like(f"{socket.gethostname()}:%"))
        )
    fresh = seen is not None and utcnow() - seen < timedelta(seconds=max_age_s)
    print(f"scheduler heartbeat: {seen.isoformat() if seen else 'never'} ({'fresh' if fresh else 'stale'})")
    return 0 if fresh else 1
