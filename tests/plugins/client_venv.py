"""The base package (the client) installed into a fresh virtualenv, as CI would install it; timed and sized."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "megatron", "submitit", "sqlalchemy", "fastapi", "pydantic_settings", "uvicorn", "psycopg")


@dataclass
class ClientVenv:
    """A virtualenv holding only the base install; `bin` goes first on a CI job's PATH."""

    root: Path
    install_s: float
    added_bytes: int

    @property
    def bin(self) -> Path:
        """Its bin folder (parity, python, pip)."""
        return self.root / "bin"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def install_base_client(dest: Path) -> ClientVenv:
    """Build this checkout's wheel, then `pip install` it (base, no extras) into a new venv at dest/venv."""
    wheels = dest / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600)
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' in-tree build folder
    venv = dest / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    before = _size(venv)
    t0 = time.monotonic()
    wheel = next(wheels.glob("megatron_resume_parity-*.whl"))
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=600)
    return ClientVenv(venv, round(time.monotonic() - t0, 1), _size(venv) - before)
