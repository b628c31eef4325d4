"""Drive one endpoint with wrk (a C load generator) and account the CPU each side spent per request.

A Python client on a 2-core machine costs about as much CPU per request as the server it measures,
so the throughput it reports is the client's. wrk costs a few microseconds per request, and the CPU
accounting (server processes and Postgres backends, read from /proc before and after) gives a cost
per request that a busy machine does not distort: CPU seconds are counted, not wall seconds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil

UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}

POST_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(token)s"
local threads, counter = 0, 0
setup = function(thread) threads = threads + 1; thread:set("tid", threads) end
request = function()
  counter = counter + 1
  local body = string.format('{"spec": %(spec)s, "labels": {"commit": "w%%s-%%d", "branch": "bench"}}',
                             tid or 0, counter)
  return wrk.format(nil, "%(path)s", nil, body)
end
"""

GET_LUA = """
local threads = 0
setup = function(thread) threads = threads + 1; thread:set("tid", threads) end
init = function() math.randomseed(1000 + (tid or 0)) end
request = function() return wrk.format("GET", "%(path)s" .. math.random(1, %(n)d)) end
"""


def paced(rate: float, connections: int) -> str:
    """Lua to append to a script: each connection waits so that all together offer at most `rate` req/s."""
    return f"\ndelay = function() return {max(1, round(connections * 1000 / rate))} end\n"


def available() -> bool:
    """True when wrk is installed (Debian package `wrk`)."""
    return shutil.which("wrk") is not None


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes and their children have used so far, from /proc."""
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


def _postgres_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres")]


def _ms(text: str) -> float:
    found = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    if found is None:  # wrk prints e.g. "-nanus" when no request completed
        return float("nan")
    return float(found.group(1)) * UNITS[found.group(2)]


def drive(url: str, script: str, *, seconds: float, connections: int, server_pids: list[int]) -> dict[str, float]:
    """Run wrk against url with the Lua script; throughput, latency percentiles and CPU per request."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(script)
    pg_before, srv_before = cpu_seconds(_postgres_pids()), cpu_seconds(server_pids)
    out = subprocess.run(
        ["wrk", "-t", "1", "-c", str(connections), "-d", f"{max(1, int(seconds))}s", "--latency", "-s", fh.name, url],
        capture_output=True, text=True, check=True,
    ).stdout
    srv_cpu, pg_cpu = cpu_seconds(server_pids) - srv_before, cpu_seconds(_postgres_pids()) - pg_before
    Path(fh.name).unlink()
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    wall = float(re.search(r"requests in ([\d.]+)s", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(bad.group(1)) if bad else 0
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if socket_errors:
        errors += sum(int(g) for g in socket_errors.groups())
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    n = max(1, requests)
    return {"requests": requests, "wall_s": wall, "rps": requests / wall, "errors": errors, "p50_ms": p50,
            "p99_ms": p99, "server_cpu_ms": srv_cpu * 1000 / n, "postgres_cpu_ms": pg_cpu * 1000 / n}
