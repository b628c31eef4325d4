"""Live progress for `parity submit --wait`: a flushed line as each check ends, a heartbeat while nothing does.

CI runners give the client a pipe or a file, where Python buffers stdout in blocks: without a flush per
line a whole wait reads as silence and then everything at exit. Every line here is flushed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import httpx

from service.core.state_names import FINISHED_RUN_STATES, RUNNING_RUN_STATES

HEARTBEAT_S = 30.0
TERMINAL = FINISHED_RUN_STATES
RUNNING = RUNNING_RUN_STATES
ENV_WAITING = {"pending", "building"}


def say(line: str, *, out: TextIO | None = None) -> None:
    """Print one line and flush it, whatever stdout is (a terminal, a pipe, a file)."""
    print(line, file=out or sys.stdout, flush=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def waiting_for(runs: list[dict[str, Any]], environment: dict[str, Any] | None = None) -> str:
    """What a wait is waiting for, in a few words: the environment's build, queued runs, running N/M."""
    total = len(runs)
    ended = sum(r["state"] in TERMINAL for r in runs)
    running = sum(r["state"] in RUNNING for r in runs)
    queued = total - ended - running
    parts = []
    if queued and environment is not None and environment.get("state") in ENV_WAITING:
        parts.append(f"environment {environment['name']} {environment['state']}"
                     + (" (the runs start when it is built)" if environment["state"] == "building" else ""))
    if running:
        states = sorted({r["state"] for r in runs if r["state"] in RUNNING})
        parts.append(f"running {running}/{total} ({', '.join(s.replace('_', ' ') for s in states)})")
    if queued:
        parts.append(f"queued {queued}/{total}")
    if ended:
        parts.append(f"done {ended}/{total}")
    return ", ".join(parts) or "nothing"


class Heartbeat:
    """Says what a wait waits for when nothing was printed for `every` seconds (and never more often)."""

    def __init__(self, *, every: float = HEARTBEAT_S, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.out, self.clock = every, out, clock
        self.started = self.last = clock()

    def say(self, line: str) -> None:
        """A line of news: printed and flushed; the heartbeat waits a full period after it."""
        say(line, out=self.out)
        self.last = self.clock()

    def due(self) -> bool:
        """Whether a heartbeat line is due now."""
        return self.clock() - self.last >= self.every

    def until_due(self) -> float:
        """Seconds until a heartbeat line is due (0 when it is): a wait holds no longer than this, or the
        line would come late by up to a whole long poll."""
        return max(0.0, self.every - (self.clock() - self.last))

    def beat(self, what: str) -> None:
        """Print `waiting (…): what` if the period passed since the last line."""
        if self.due():
            self.say(f"waiting ({_duration(self.clock() - self.started)}): {what}")


def environment_of(http: httpx.Client, name: str) -> dict[str, Any] | None:
    """The environment's document, or None when it cannot be read (progress only: never an error)."""
    try:
        resp = http.get(f"/api/v1/environments/{name}")
    except httpx.HTTPError:
        return None
    doc = resp.json() if resp.is_success else None
    return doc if isinstance(doc, dict) else None
