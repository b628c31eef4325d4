"""`parity sweep`: queue configs × environments × variations on the service and print the grid."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from service.commands.env import _client_args, _detail, client


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="queue every config × environment × variation run; print the grid")
    p.add_argument("--config", action="append", required=True, help="repeatable")
    p.add_argument("--environment", action="append", default=[], help="repeatable (default: default)")
    p.add_argument("--variation", action="append", default=[], type=json.loads,
                   help='spec overrides as JSON, repeatable, e.g. \'{"sharding": "fully_sharded_model_space"}\'')
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-step", type=int, default=3)
    p.add_argument("--wait", action="store_true", help="poll until every run has finished")
    p.add_argument("--timeout", type=float, default=7200)
    _client_args(p)
    p.set_defaults(func=run)


def grid_table(grid: dict[str, Any]) -> str:
    """The grid as a Markdown table: verdict and signatures (or state) per cell."""
    lines = ["| environment | megatron-core | variation | " + " | ".join(grid["configs"]) + " |",
             "|---" * (len(grid["configs"]) + 3) + "|"]
    for row in grid["rows"]:
        cells = []
        for config in grid["configs"]:
            c = row["cells"].get(config)
            text = "—" if c is None else (c["verdict"] or c["state"]) + (
                f": {', '.join(c['signatures'])}" if c and c["signatures"] else "")
            cells.append(text)
        lines.append(f"| {row['environment']} | {row['megatron_core'] or '?'} | {row['variation']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    body = {"configs": args.config, "environments": args.environment or ["default"], "variations": args.variation,
            "base": {"dp": args.dp, "steps": args.steps, "save_step": args.save_step}}
    with client(args) as http:
        resp = http.post("/api/v1/sweeps", json=body)
        if resp.status_code != 202:
            print(f"parity sweep: {resp.status_code} {_detail(resp)}", file=sys.stderr)
            return 2
        grid = resp.json()
        print(f"sweep {grid['id']}: {grid['runs']} runs queued: {grid['links']['dashboard']}", file=sys.stderr)
        deadline = time.monotonic() + args.timeout
        while args.wait and grid["finished"] < grid["runs"] and time.monotonic() < deadline:
            time.sleep(5)
            grid = http.get(f"/api/v1/sweeps/{grid['id']}").json()
        print(grid_table(grid))
        return 0 if grid["finished"] == grid["runs"] or not args.wait else 2
