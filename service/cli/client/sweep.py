"""`parity sweep`: queue configs × environments × variations on the service and print the grid."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from jobs.signature_names import UNSUPPORTED_BY_BUILD
from service.cli.client.env import _client_args, _detail, client, ensure_build


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="queue every config × environment × variation run; print the grid")
    p.add_argument("--config", action="append", required=True, help="repeatable; `all` for every named config")
    p.add_argument("--environment", action="append", default=[], help="repeatable (default: default)")
    p.add_argument("--build", action="append", default=[], metavar="LINES",
                   help="an environment built (or reused) by the service from requirement lines separated by "
                        "';', e.g. megatron-core==0.15.3 (repeatable: one environment each)")
    p.add_argument("--variation", action="append", default=[], type=json.loads,
                   help='spec overrides as JSON, repeatable, e.g. \'{"sharding": "fully_sharded_model_space"}\'')
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-step", type=int, default=3)
    p.add_argument("--wait", action="store_true", help="poll until every run has finished")
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--release-table", action="store_true",
                   help="print one row per Megatron-Core version and variation (the release table of docs/releases.md)")
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
            text = "—" if c is None else (c.get("label") or c["verdict"] or c["state"]) + (
                f": {', '.join(c['signatures'])}" if c and c["signatures"] else "")
            cells.append(text)
        lines.append(f"| {row['environment']} | {row['megatron_core'] or '?'} | {row['variation']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def release_cell(cell: dict[str, Any] | None) -> str:
    """One release-table cell: the verdict and its signatures, or "unsupported" naming what is missing."""
    if cell is None:
        return "—"
    signatures = list(cell["signatures"] or [])
    if UNSUPPORTED_BY_BUILD in signatures:
        # "UnsupportedByBuild: <option> is not supported by this build (megatron-core X): <what it lacks>"
        message = str(cell.get("error_message") or "").removeprefix("UnsupportedByBuild: ")
        option, _, missing = message.partition(" is not supported by this build")
        return f"unsupported: {option}" + (f" ({missing.partition('): ')[2]})" if "): " in missing else "")
    verdict = cell.get("label") or cell["verdict"] or cell["state"]
    return f"**{verdict}**" + (f": {', '.join(signatures)}" if signatures else "")


def release_table(grid: dict[str, Any]) -> str:
    """The grid as docs/releases.md's release table: rows by Megatron-Core version (then variation)."""
    variations = len({row["variation"] for row in grid["rows"]}) > 1
    head = "| megatron-core | " + ("variation | " if variations else "") + " | ".join(grid["configs"]) + " |"
    lines = [head, "|---" * (len(grid["configs"]) + 1 + variations) + "|"]

    def order(row: dict[str, Any]) -> tuple[Any, ...]:
        version = tuple(int(p) if p.isdigit() else 0 for p in str(row["megatron_core"] or "0").split("."))
        return version, row["variation"]

    for row in sorted(grid["rows"], key=order):
        cells = [release_cell(row["cells"].get(config)) for config in grid["configs"]]
        lines.append(f"| {row['megatron_core'] or row['environment']} | "
                     + (f"{row['variation']} | " if variations else "") + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    with client(args) as http:
        configs = args.config
        if "all" in configs:
            listed = http.get("/api/v1/configs").json()
            configs = [c["name"] for c in (listed["configs"] if isinstance(listed, dict) else listed)]
        environments = list(args.environment)
        for lines in args.build:  # queued builds: the runs wait for their environment, then start
            environments.append(ensure_build(http, [line.strip() for line in lines.split(";") if line.strip()])["name"])
        body = {"configs": configs, "environments": environments or ["default"], "variations": args.variation,
                "base": {"dp": args.dp, "steps": args.steps, "save_step": args.save_step}}
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
        print(release_table(grid) if args.release_table else grid_table(grid))
        return 0 if grid["finished"] == grid["runs"] or not args.wait else 2
