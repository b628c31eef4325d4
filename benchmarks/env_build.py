"""How long an environment build takes with each way of giving it the service's torch; prints figures.

  shared-pth : what service/environments/recipe.py does (venv + .pth to symlinks of the service's torch)
  torch-wheel: a plain venv that installs torch==<same> again from the local wheel folder
Both then install the same requirement (default megatron-core==0.16.1) and import it.

    .venv/bin/python benchmarks/env_build.py [--requirement megatron-core==0.15.3] [--folder /tmp/envbench]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service.environments.recipe import build_environment  # noqa: E402


def _du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()[0])


def torch_wheel(folder: Path, requirement: str) -> float:
    """A venv that gets its own copy of torch from the wheel folder, then the requirement."""
    t0 = time.time()
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(folder / "venv")], check=True)
    pip = [str(folder / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"torch=={md.version('torch')}", "submitit", "psutil", requirement], check=True)
    subprocess.run([str(folder / "venv" / "bin" / "python"), "-c", "import torch, megatron.core"], check=True)
    return time.time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requirement", default="megatron-core==0.16.1")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/parity-envbench"))
    args = parser.parse_args()
    shutil.rmtree(args.folder, ignore_errors=True)
    doc = build_environment(str(args.folder / "shared"), [args.requirement])
    print(f"shared-pth : {doc['seconds']:7.1f} s  {_du(args.folder / 'shared') / 1e6:8.1f} MB on disk")
    seconds = torch_wheel(args.folder / "wheel", args.requirement)
    print(f"torch-wheel: {seconds:7.1f} s  {_du(args.folder / 'wheel') / 1e6:8.1f} MB on disk")
    shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
