"""Phase logs: served only from inside the run folder, and excerpts around a failure."""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePath

from jobs.run_folder import LOG_SUFFIXES, AttemptFolder
from models import Phase
from service.web.dashboard.rendering import PageError

# Read at most this much from the end of a log: enough for a traceback, bounded for huge logs.
TAIL_BYTES = 1 << 20
# Triage reads every listed log of a failed phase (ranks x files): a smaller tail per file.
TRIAGE_TAIL_BYTES = 128 << 10
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


def listed_logs(phase: Phase) -> list[str]:
    """A phase's logs: those recorded when it ended, else (still running) what its attempt folder holds now."""
    if phase.log_paths:
        return list(phase.log_paths)
    return [str(p) for p in AttemptFolder(Path(phase.folder)).logs()] if phase.folder else []


def resolve_log(run_folder: Path, phase: Phase, requested: str) -> Path:
    """The listed log a request names, or PageError 403/404; never a path outside the run folder.

    Only the files the phase lists (its rank logs and submitit's stdout/stderr, all .out/.err/.log)
    are served: not the pickles, checkpoints or anything else a job left in its folder.
    """
    if not requested or "\x00" in requested:
        raise PageError(404, "no log file named")
    if ".." in PurePath(requested).parts:
        raise PageError(403, "log paths may not contain '..'")
    root = run_folder.resolve()
    candidate = root / requested
    # resolve() follows symlinks, so a link that points outside the run folder is caught here too
    if not candidate.resolve().is_relative_to(root):
        raise PageError(403, "log files are served only from inside the run folder")
    if candidate.suffix not in LOG_SUFFIXES:
        raise PageError(403, f"only log files are served ({', '.join(LOG_SUFFIXES)})")
    listed = {Path(p) for p in listed_logs(phase)} | {Path(p).resolve() for p in listed_logs(phase)}
    if candidate not in listed:
        raise PageError(404, "that file is not a log of this phase")
    return candidate


def read_tail(path: Path, max_bytes: int = TAIL_BYTES) -> tuple[list[str], bool]:
    """The last max_bytes of a regular file as lines (never through a final symlink); True when cut."""
    try:
        # O_NOFOLLOW: a log swapped for a symlink after the checks above is refused, not followed
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PageError(404, "log file not found (it may not have been written yet)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PageError(403, "log files may not be symbolic links") from None
        raise PageError(404, f"log file cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PageError(403, "only regular files are served")
        size = info.st_size
        fh.seek(max(0, size - max_bytes))
        data = fh.read(max_bytes)
    lines = data.decode("utf-8", errors="replace").splitlines()
    cut = size > max_bytes
    return (lines[1:] if cut else lines), cut  # the first line of a cut read is partial


def numbered(lines: list[str], start: int = 0) -> list[Line]:
    """Lines with 1-based numbers and failure marks."""
    return [Line(start + i + 1, text, bool(TRACEBACK.search(text) or ERROR.search(text)))
            for i, text in enumerate(lines)]


# Library warnings (Transformer Engine, Apex, torch deprecations) printed by every healthy run too: an
# excerpt about a failure leaves them out ("Warning" in a class name followed by ':', warnings.warn lines).
WARNING_LINE = re.compile(r"\b[A-Z]\w*Warning\b:?|^\s*warnings\.warn\(|\bWARNING\b|^\[W[\s\d]")


def without_warnings(lines: list[Line]) -> list[Line]:
    """lines without library warnings, and without the indented source line Python prints under each one."""
    kept: list[Line] = []
    dropped = False
    for line in lines:
        if WARNING_LINE.search(line.text):
            dropped = True
            continue
        if dropped and line.text[:1].isspace() and not line.mark:
            continue  # `  warnings.warn(...)` / `  return torch.xxx(...)`: the warning's own source line
        dropped = False
        kept.append(line)
    return kept


def failure_window(lines: list[str], before: int = 8, after: int = 60, tail: int = 40) -> tuple[str, list[Line]]:
    """The lines around the last traceback (or last error line), else the tail, warnings left out.
    -> (kind, lines), numbered as in the file."""
    kept = without_warnings(numbered(lines))
    for kind, pattern, lo, hi in (("traceback", TRACEBACK, before, after), ("error", ERROR, 20, 20)):
        hits = [i for i, line in enumerate(kept) if pattern.search(line.text)]
        if hits:
            return kind, kept[max(0, hits[-1] - lo):hits[-1] + hi + 1]
    return "tail", kept[max(0, len(kept) - tail):]


def excerpts(phase: Phase, run_folder: Path, limit: int = 4) -> list[Excerpt]:
    """Failure windows from a phase's logs: files with a traceback or error first, else the tails."""
    found: list[Excerpt] = []
    for raw in phase.log_paths or []:
        try:
            path = resolve_log(run_folder, phase, link_path(raw, run_folder))
        except PageError:
            continue
        try:
            lines, cut = read_tail(path, TRIAGE_TAIL_BYTES)
        except PageError:
            continue
        if not lines:
            continue
        kind, window = failure_window(lines)
        found.append(Excerpt(path=link_path(raw, run_folder), kind=kind, lines=window, truncated=cut))
    # tracebacks first, then error lines, then plain tails; stderr before stdout within each
    found.sort(key=lambda e: ({"traceback": 0, "error": 1, "tail": 2}[e.kind], not e.path.endswith(".err")))
    return found[:limit]
