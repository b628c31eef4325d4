"""Tracks belong to someone: a token writes only the tracks its patterns grant (admin: any).

A run's track (its `branch` label, else its environment's name: service/core/checks.py) is where its
verdict is history: a failure there opens a regression, a pass resolves one. So whoever may label a
run with a track may move that track's state; a token is granted fnmatch patterns (the CI token
`pr-*`, the main track's own token `main`) and every request that queues runs is checked against
them before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Protocol

from service.core.checks import track_of
from service.core.errors import Forbidden

# what a pattern may hold: the characters of a branch name plus fnmatch's * ? [ ] !
PATTERN = re.compile(r"^[A-Za-z0-9._/+@=*?\[\]!-]{1,200}$")
MAX_PATTERNS = 32


class Grant(Protocol):
    """What a token says about itself: its name, scopes and track patterns."""

    @property
    def name(self) -> str: ...

    @property
    def scopes(self) -> Sequence[str]: ...

    @property
    def tracks(self) -> Sequence[str]: ...


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns, de-duplicated in order; ValueError naming `tracks` and what is allowed otherwise."""
    out = list(dict.fromkeys(p.strip() for p in patterns))
    bad = [p for p in out if not PATTERN.match(p)]
    if bad:
        raise ValueError(f"tracks: {bad[0][:200]!r} is not a track pattern; allowed: 1-200 characters of letters, "
                         "digits and ._/+@=- with fnmatch's * ? [ ] ! (e.g. 'pr-*', 'main', '*')")
    if len(out) > MAX_PATTERNS:
        raise ValueError(f"tracks: {len(out)} patterns; at most {MAX_PATTERNS}")
    return out


def may_write(grant: Grant, track: str) -> bool:
    """Whether this token may write this track (admin: every track)."""
    return "admin" in grant.scopes or any(fnmatchcase(track, p) for p in grant.tracks)


def authorize_track(grant: Grant, *, labels: dict[str, str] | None, environment: str) -> None:
    """403 naming the label (or environment), the track and the allowed patterns when grant may not write it."""
    track = track_of(labels, environment)[:200]
    if may_write(grant, track):
        return
    allowed = ", ".join(repr(p) for p in grant.tracks) or "none"
    if (labels or {}).get("branch", "").strip():
        field, what = "labels.branch", f"labels.branch {track!r}"
    else:
        field, what = "environment", f"environment {track!r} (no branch label: the run's track is its environment)"
    raise Forbidden(
        f"{field}: token {grant.name!r} may not write track {what}; its tracks: {allowed} "
        "(`parity token create --track PATTERN`)", field=field)
