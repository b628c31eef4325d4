"""`parity scheduler`: the submitter + reconciler loop (run one or several replicas)."""

from __future__ import annotations

import argparse
import signal
import threading

from service.commands.common import load_settings, ready_database


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scheduler", help="claim queued runs, submit phases through submitit, collect results")
    p.add_argument("--once", action="store_true", help="do one pass and exit")
    p.add_argument("--migrate", action="store_true", help="run `db upgrade` first (implied for embedded Postgres)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service.scheduler.loop import decide_executor, heartbeat, replica_name, run_forever, tick

    settings = load_settings()
    ready_database(migrate=args.migrate or not settings.database_url)
    executor = decide_executor(settings)  # once: `auto` never flips to local processes later
    print(f"scheduler: executor {executor}, run folder {settings.resolved_run_folder}", flush=True)
    if args.once:
        heartbeat(replica_name(), executor)
        print(tick(settings, executor=executor))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_forever(settings, stop, executor)
    return 0
