"""Phase logs: served only from inside the run folder, and excerpts around a failure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from jobs.layout import LOG_SUFFIXES
from models import Phase
from service.dashboard.rendering import PageError

# Read at most this much from the end of a log: enough for a traceback, bounded for huge logs.
TAIL_BYTES = 1 << 20
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
ERROR = re.compile(r"\b[A-Z]\w*(Error|Exception)\b|\bERROR\b|\bsrun: error\b")


@dataclass
class Line:
    """One numbered log line; `mark` is set on lines that look like the failure."""

    number: int
    text: str
    mark: bool = False


@dataclass
class Excerpt:
    """A window of a log file, and whether the file was cut to its tail first."""

    path: str
    kind: str
    lines: list[Line]
    truncated: bool


def link_path(path: str, run_folder: Path) -> str:
    """The path to put in a log link: relative to the run folder when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(run_folder.resolve()))
    except ValueError:
        return path


def resolve_log(run_folder: Path, phase: Phase, requested: str) -> Path:
    """The file a log request names, or PageError 403/404; never a path outside the run folder."""
    if not requested or "\x00" in requested:
        raise PageError(404, "no log file named")
    if ".." in PurePath(requested).parts:
        raise PageError(403, "log paths may not contain '..'")
    root = run_folder.resolve()
    # resolve() follows symlinks, so a link that points outside the run folder is caught here too
    target = (root / requested).resolve()
    if not target.is_relative_to(root):
        raise PageError(403, "log files are served only from inside the run folder")
    known = {Path(p).resolve() for p in phase.log_paths or []}
    phase_dir = Path(phase.folder).resolve() if phase.folder else None
    in_attempt = bool(phase_dir and phase_dir.is_relative_to(root) and target.is_relative_to(phase_dir))
    # inside the attempt folder only log files (jobs.layout), never checkpoints or pickles
    if target not in known and not (in_attempt and target.suffix in LOG_SUFFIXES):
        raise PageError(404, "that file is not a log of this phase")
    if not target.is_file():
        raise PageError(404, "log file not found (it may not have been written yet)")
    return target


def read_tail(path: Path, max_bytes: int = TAIL_BYTES) -> tuple[list[str], bool]:
    """The last max_bytes of a file as lines; True when the start was cut off."""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        data = fh.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    cut = size > max_bytes
    return (lines[1:] if cut else lines), cut  # the first line of a cut read is partial


def numbered(lines: list[str], start: int = 0) -> list[Line]:
    """Lines with 1-based numbers and failure marks."""
    return [Line(start + i + 1, text, bool(TRACEBACK.search(text) or ERROR.search(text)))
            for i, text in enumerate(lines)]


def failure_window(lines: list[str], before: int = 8, after: int = 60, tail: int = 40) -> tuple[str, list[Line]]:
    """The lines around the last traceback (or last error line), else the tail. -> (kind, lines)."""
    for kind, pattern, lo, hi in (("traceback", TRACEBACK, before, after), ("error", ERROR, 20, 20)):
        hits = [i for i, text in enumerate(lines) if pattern.search(text)]
        if hits:
            start = max(0, hits[-1] - lo)
            return kind, numbered(lines[start:hits[-1] + hi + 1], start)
    start = max(0, len(lines) - tail)
    return "tail", numbered(lines[start:], start)


def excerpts(phase: Phase, run_folder: Path, limit: int = 4) -> list[Excerpt]:
    """Failure windows from a phase's logs: files with a traceback or error first, else the tails."""
    found: list[Excerpt] = []
    for raw in phase.log_paths or []:
        try:
            path = resolve_log(run_folder, phase, link_path(raw, run_folder))
        except PageError:
            continue
        lines, cut = read_tail(path)
        if not lines:
            continue
        kind, window = failure_window(lines)
        found.append(Excerpt(path=link_path(raw, run_folder), kind=kind, lines=window, truncated=cut))
    # tracebacks first, then error lines, then plain tails; stderr before stdout within each
    found.sort(key=lambda e: ({"traceback": 0, "error": 1, "tail": 2}[e.kind], not e.path.endswith(".err")))
    return found[:limit]
