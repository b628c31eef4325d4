"""The release table: each Megatron-Core release × each config, its verdict and signatures.

Each release is installed once into a cache folder (`pip install --no-deps --target`, a few MB),
put first on PYTHONPATH, and checked with `parity run-local` (DP 2, 6 steps, save at 3, no
workarounds). Prints a Markdown table (the README's) and writes every result as JSON beside it.

    .venv/bin/python scripts/release_table.py [--releases 0.12.3 0.16.1] [--configs moe-fp32-router]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("0.12.3", "0.13.1", "0.14.0", "0.15.3", "0.16.1")
SPEC = ["--dp", "2", "--steps", "6", "--save-step", "3"]


def install(release: str, cache: Path) -> Path:
    """cache/<release> holding megatron-core==release (no dependencies: torch is the service's)."""
    target = cache / release
    if not (target / "megatron" / "core").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        f"megatron-core=={release}"], check=True)
    return target


def check(release_dir: Path, config: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """Run one parity check on one release; return its result document (or an error stub)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(release_dir), str(REPO)]))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "service.cli", "run-local", "--config", config, *SPEC, *extra,
                           "--json"],
                          env=env, capture_output=True, text=True, timeout=1800)
    try:
        result: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        result = {"verdict": "error", "signatures": [], "error": {"message": proc.stderr[-500:]}}
    result["wall_s"] = round(time.time() - t0, 1)
    out.write_text(json.dumps(result, default=str))
    return result


def cell(result: dict[str, Any]) -> str:
    """One table cell: the verdict and its signatures, or 'unsupported' naming what is missing."""
    signatures = list(result.get("signatures") or [])
    if "unsupported-by-build" in signatures:
        message = str((result.get("error") or {}).get("message", ""))
        return "unsupported: " + message.split("): ", 1)[0].replace(" is not supported by this build (", ", ")
    verdict = result.get("verdict", "error")
    return f"**{verdict}**" + (f": {', '.join(signatures)}" if signatures else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="+", default=list(RELEASES))
    parser.add_argument("--configs", nargs="+")
    parser.add_argument("--cache", type=Path, default=Path("/var/tmp/parity-releases"))
    parser.add_argument("--out", type=Path, default=Path("release-table"))
    parser.add_argument("--sharding", help="optimizer sharding type (default: the spec's, dp_reshardable)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from jobs.configs import config_names

    configs = args.configs or config_names()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for release in args.releases:
        folder = install(release, args.cache)
        cells = []
        for config in configs:
            extra = ["--sharding", args.sharding] if args.sharding else []
            result = check(folder, config, args.out / f"{release}-{config}.json", extra)
            cells.append(cell(result))
            print(f"{release} {config}: {cells[-1]} ({result['wall_s']} s)", file=sys.stderr, flush=True)
        rows.append(f"| {release} | " + " | ".join(cells) + " |")
    table = "\n".join([f"| megatron-core | {' | '.join(configs)} |", "|---" * (len(configs) + 1) + "|", *rows])
    (args.out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
