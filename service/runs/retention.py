"""Retention: checkpoints go once a verdict is stored, whole run folders after PARITY_KEEP_DAYS.

Checkpoints are most of a run folder's bytes and are only needed to reproduce a failure, so a
passing (or cancelled) run loses them at once and a failing or errored one keeps them for
PARITY_KEEP_FAILED_DAYS. Logs and documents stay until the whole folder is pruned. Deleting is
idempotent (a missing folder is already deleted), so a crash between rmtree and commit only means
the next pass marks the row.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from jobs.verdict_names import FAILED
from models import Run
from models.base import utcnow
from service.core.run_state import TERMINAL
from service.core.settings import Settings

log = logging.getLogger(__name__)
_TERMINAL = [s.value for s in TERMINAL]


def run_dir(settings: Settings, run_id: int) -> Path:
    """Where one run's checkpoints, probes and job folders live (same as the scheduler's)."""
    return settings.resolved_run_folder / f"run-{run_id}"


def checkpoint_dirs(folder: Path) -> list[Path]:
    """Every checkpoint folder of a run (one per attempt layout the jobs may use)."""
    if not folder.is_dir():
        return []
    return [p for p in folder.rglob("checkpoint*") if p.is_dir() and not p.is_symlink()]


def apply(session: Session, settings: Settings, *, limit: int = 50) -> dict[str, int]:
    """One retention pass over at most `limit` runs of each kind. -> counts of what was deleted."""
    now = utcnow()
    failed_cutoff = now - timedelta(days=settings.keep_failed_days)
    done = {"checkpoints": 0, "folders": 0}
    due = session.scalars(
        select(Run).where(
            Run.state.in_(_TERMINAL), Run.checkpoints_deleted_at.is_(None), Run.finished_at.is_not(None),
            or_(Run.verdict.is_(None), Run.verdict.not_in(FAILED), Run.finished_at < failed_cutoff),
        ).order_by(Run.id).limit(limit).with_for_update(skip_locked=True)
    ).all()
    for run in due:
        for path in checkpoint_dirs(run_dir(settings, run.id)):
            shutil.rmtree(path, ignore_errors=True)
        run.checkpoints_deleted_at = now
        done["checkpoints"] += 1
    if settings.keep_days is not None:
        old = session.scalars(
            select(Run).where(
                Run.state.in_(_TERMINAL), Run.files_deleted_at.is_(None),
                Run.finished_at < now - timedelta(days=settings.keep_days),
            ).order_by(Run.id).limit(limit).with_for_update(skip_locked=True)
        ).all()
        for run in old:
            shutil.rmtree(run_dir(settings, run.id), ignore_errors=True)
            run.files_deleted_at = now
            run.checkpoints_deleted_at = run.checkpoints_deleted_at or now
            done["folders"] += 1
    if any(done.values()):
        log.info("retention: %s", done)
    return done


_usage_cache: dict[str, tuple[float, dict[str, Any]]] = {}
USAGE_TTL_S = 60.0


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under root (symlinks not followed)."""
    total = 0
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total


def disk_usage(settings: Settings) -> dict[str, Any]:
    """The run folder's size and its file system's free space (walked at most once a minute)."""
    root = settings.resolved_run_folder
    key = str(root)
    cached = _usage_cache.get(key)
    if cached and time.monotonic() - cached[0] < USAGE_TTL_S:
        return cached[1]
    out: dict[str, Any] = {"run_folder": key, "run_folder_bytes": tree_bytes(root) if root.is_dir() else 0}
    probe = root if root.exists() else root.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    fs = shutil.disk_usage(probe)
    out.update(fs_total_bytes=fs.total, fs_free_bytes=fs.free)
    _usage_cache[key] = (time.monotonic(), out)
    return out
