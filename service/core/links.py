"""Every link the service emits starts here: PARITY_PUBLIC_URL, else the address `parity serve` listens on.

`parity serve` records the address it really listens on in the run folder (which the dashboard, the
scheduler and the jobs already share), so the scheduler's notifications link to the right port even
when the server was started with `--port`. The request's own host is used only when neither is known.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from service.core.settings import Settings, get_settings

log = logging.getLogger(__name__)
SERVE_RECORD = ".parity-serve.json"


def serve_record_path(settings: Settings) -> Path:
    """Where `parity serve` records the base URL it listens on."""
    return settings.resolved_run_folder / SERVE_RECORD


def listening_url(host: str, port: int) -> str:
    """The URL people reach a server bound to host:port by (a wildcard bind is named by this host's name)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def record_serving(settings: Settings, host: str, port: int) -> str:
    """Record the address `parity serve` listens on; warn when links then rest on it alone. -> the URL."""
    url = listening_url(host, port)
    path = serve_record_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "host": socket.gethostname()}))
        tmp.replace(path)
        _recorded.pop(path, None)
    except OSError as exc:
        log.warning("cannot record the serving address in %s (%s): notifications will link to %s",
                    path, exc, settings.base_url)
    if not settings.public_url:
        log.warning("PARITY_PUBLIC_URL is not set: links (notifications, JUnit, the API) use %s, the address "
                    "this server listens on; set PARITY_PUBLIC_URL to the URL people reach it by", url)
    return url


# path -> (checked at, (mtime_ns, size, inode), url): every API response builds links. Reading and
# parsing the record on each was a few per cent of a GET, and so was the stat that tells whether
# another `parity serve` rewrote it: it is re-stated at most once a second (this process's own
# record_serving forgets it at once).
_recorded: dict[Path, tuple[float, tuple[int, int, int], str | None]] = {}
RECHECK_S = 1.0


def recorded_url(settings: Settings) -> str | None:
    """The base URL the last `parity serve` recorded, if any."""
    path = serve_record_path(settings)
    now = time.monotonic()
    known = _recorded.get(path)
    if known is not None and now - known[0] < RECHECK_S:
        return known[2]
    try:
        st = path.stat()
    except OSError:
        _recorded.pop(path, None)
        return None
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    if known is not None and known[1] == stamp:
        _recorded[path] = (now, stamp, known[2])
        return known[2]
    try:
        url = json.loads(path.read_text()).get("url")
    except (OSError, ValueError, AttributeError):
        return None
    found = str(url).rstrip("/") if url else None
    _recorded[path] = (now, stamp, found)
    return found


def public_base(settings: Settings, request: Request | None = None) -> str:
    """The base URL for links: PARITY_PUBLIC_URL, else the address `parity serve` listens on, else the
    request's host, else PARITY_API_HOST:PARITY_API_PORT."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    recorded = recorded_url(settings)
    if recorded:
        return recorded
    if request is not None:
        # behind a proxy, uvicorn's --proxy-headers makes this the client-facing host
        return str(request.base_url).rstrip("/")
    return settings.base_url


def warn_if_unknown(settings: Settings, who: str) -> None:
    """At start-up: say so when links can only guess (no public URL, no recorded serving address)."""
    if not settings.public_url and recorded_url(settings) is None:
        log.warning("%s: neither PARITY_PUBLIC_URL nor a running `parity serve` is known (looked in %s): "
                    "links will point at %s, which may not be where the dashboard is",
                    who, serve_record_path(settings), settings.base_url)


async def _base(request: Request) -> str:
    # async: a sync dependency is a threadpool trip per request; this is a cached stat, cheap on the loop
    return public_base(get_settings(), request)


BaseUrl = Annotated[str, Depends(_base)]


def run_url(base: str, run_id: int, page: str = "") -> str:
    """Dashboard link of a run ('' for its page, 'triage' for its triage page)."""
    return f"{base}/runs/{run_id}" + (f"/{page}" if page else "")


def regression_url(base: str, regression_id: int) -> str:
    """Dashboard link of a regression."""
    return f"{base}/regressions/{regression_id}"


def sweep_urls(base: str, sweep_id: str) -> dict[str, str]:
    """API and dashboard links of a sweep."""
    return {"self": f"{base}/api/v1/sweeps/{sweep_id}", "dashboard": f"{base}/sweeps/{sweep_id}"}


def bisect_urls(base: str, bisect_id: str) -> dict[str, str]:
    """API and dashboard links of a bisect."""
    return {"self": f"{base}/api/v1/bisects/{bisect_id}", "dashboard": f"{base}/bisects/{bisect_id}"}
