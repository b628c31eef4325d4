"""How long the environment for an uploaded wheel takes to build, with uv and with pip; prints figures.

Each build is `service/environments/recipe.build_environment` on one wheel file (what an uploaded
`artifact:<sha256>` resolves to), on the service's Python with the shared torch: the venv, the stubs,
the install (bytecode included) and the package list. It imports nothing it installed: the environment's
first warm worker is its import check (service/runs/import_check.py); before that change (`67240d2`) the
build ended on one import check of torch and Megatron-Core, the fourth column then. `--installer pip` is
the same build with pip where uv would run (the service's way before uv, and its fallback when uv is not installed).
Runs alternate between the two so load from elsewhere falls on both alike.

    .venv/bin/python benchmarks/env_build.py [--wheel megatron_core-….whl] [--repeat 3]

Without --wheel, the service's own Megatron-Core release is fetched once as a wheel (pip download
--no-deps, from pip's usual indexes) into the benchmark's folder.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service.environments.recipe import build_environment  # noqa: E402

STEP = re.compile(r"^\[(\d\d:\d\d:\d\d)\] exit \d+ after ([0-9.]+)s$")


def service_wheel(folder: Path) -> Path:
    """The service's Megatron-Core release as a wheel file (downloaded once, kept in `folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("megatron_core-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder),
                        f"megatron-core=={md.version('megatron-core')}"], check=True)
        found = sorted(folder.glob("megatron_core-*.whl"))
    return found[-1]


def steps(log: Path) -> list[float]:
    """Each command's seconds, in order, from the build's log."""
    return [float(m.group(2)) for line in log.read_text().splitlines() if (m := STEP.match(line))]


def build_once(folder: Path, wheel: Path, use_uv: bool) -> tuple[float, list[float]]:
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    doc = build_environment(str(folder), [str(wheel)], use_uv=use_uv)
    seconds = time.perf_counter() - t0
    assert doc["installer"] == ("uv" if use_uv else "pip"), doc["installer"]
    return seconds, steps(folder / "build.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="the wheel to build on (default: the service's Megatron-Core)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--installer", choices=("both", "uv", "pip"), default="both")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/parity-envbench"))
    args = parser.parse_args()
    wheel = args.wheel or service_wheel(args.folder / "wheels")
    ways = {"both": ("pip", "uv"), "uv": ("uv",), "pip": ("pip",)}[args.installer]
    print(f"wheel {wheel.name}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.repeat} build(s) each")
    print("columns: total, then each command of build.log: venv | install | list (s)")
    totals: dict[str, list[float]] = {way: [] for way in ways}
    for i in range(args.repeat):
        for way in ways:
            seconds, parts = build_once(args.folder / "build", wheel, use_uv=way == "uv")
            totals[way].append(seconds)
            print(f"{way:3} #{i + 1}: {seconds:6.1f} s   " + " | ".join(f"{p:5.1f}" for p in parts), flush=True)
    for way, values in totals.items():
        print(f"{way:3} median {statistics.median(values):6.1f} s  (min {min(values):.1f}, max {max(values):.1f})")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(args.folder / "build", ignore_errors=True)


if __name__ == "__main__":
    main()
