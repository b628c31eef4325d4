"""One shared torch per Python other than the service's: a base venv that builds on that Python layer on.

A 3.11 build shares the service's own torch (recipe.link_shared). No CPU torch wheel exists on
this machine for 3.12+, and PyPI's torch for Linux is the CUDA build: the wheel (527 MB) alone does
not import (libcudnn.so.9 missing), so the base installs it with its nvidia-* dependencies, once
per Python, under <builds folder>/pythons/<X.Y>/venv. Every build on that Python points a `.pth`
at the base's site-packages (as a 3.11 build points at the service's torch), so pip sees torch as
installed and the build's constraint pins it: never one torch download per build.

Two builds on one Python may start together: the first takes the lock and builds the base, the
second waits and finds it ready (ready.json, written last, names what it holds).
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

PYTHONS_FOLDER = "pythons"
READY = "ready.json"


def base_folder(builds: Path, version: str) -> Path:
    """<builds folder>/pythons/<X.Y>: beside the builds, so every Slurm node that runs them sees it."""
    return builds / PYTHONS_FOLDER / version


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def ensure_base(
    builds: Path, version: str, python: str, pins: list[str], run: Callable[[list[str], Path, str], str],
    log: Path,
) -> Path:
    """The site-packages of the base venv on `python` holding `pins` (torch and what jobs/ imports); built once."""
    folder = base_folder(builds, version)
    venv, ready = folder / "venv", folder / READY
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock_file = (folder / "lock").open("a" if ready.exists() else "w")
    except PermissionError as exc:  # a job user's build may read a base, never write one (every build imports it)
        if ready.exists() and json.loads(ready.read_text()).get("pins") == pins:
            with log.open("a") as fh:
                fh.write(f"shared Python {version} base: {venv} (ready, prepared by the service)\n")
            return site_packages(venv)
        raise PermissionError(
            f"the shared Python {version} base ({folder}) is not prepared and this build may not write it "
            f"(builds run as PARITY_JOB_USER): the service's user prepares it once with "
            f"`parity pythons prepare {version}`"
        ) from exc
    with lock_file as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the build that came second waits here for the first
        if ready.exists() and json.loads(ready.read_text()).get("pins") == pins:
            with log.open("a") as fh:
                fh.write(f"shared Python {version} base: {venv} (ready)\n")
            return site_packages(venv)
        ready.unlink(missing_ok=True)
        t0 = time.time()
        run([python, "-m", "venv", "--clear", "--without-pip", str(venv)], log, f"creating the Python {version} base")
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check"]
        run([*pip, "install", "--no-input", *pins], log, f"installing torch into the Python {version} base")
        ready.write_text(json.dumps({"pins": pins, "python": python, "seconds": round(time.time() - t0, 1)}))
        return site_packages(venv)
