"""Is a Slurm controller reachable, and which executor does `auto` pick."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time

from service.core.settings import Settings

log = logging.getLogger(__name__)
_CACHE: dict[str, tuple[float, bool, str]] = {}
_CACHE_S = 10.0


def slurm_status() -> tuple[bool, str]:
    """(reachable, detail) from `scontrol ping`, cached for a few seconds."""
    cached = _CACHE.get("ping")
    if cached and time.monotonic() - cached[0] < _CACHE_S:
        return cached[1], cached[2]
    if shutil.which("scontrol") is None or shutil.which("sbatch") is None:
        result = (False, "sbatch/scontrol not on PATH")
    else:
        try:
            out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=5)
            text = (out.stdout + out.stderr).strip()
            result = (out.returncode == 0 and "UP" in text, text.splitlines()[0] if text else "no answer")
        except (subprocess.TimeoutExpired, OSError) as exc:
            result = (False, f"scontrol ping failed: {exc}")
    _CACHE["ping"] = (time.monotonic(), *result)
    return result


def pick_executor(settings: Settings) -> str:
    """'slurm' or 'local': the configured one, or for `auto` Slurm when a controller answers."""
    if settings.executor != "auto":
        return settings.executor
    reachable, detail = slurm_status()
    chosen = "slurm" if reachable else "local"
    log.info("PARITY_EXECUTOR=auto picked %s (%s)", chosen, detail)
    return chosen
