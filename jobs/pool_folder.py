"""The folder of one warm-pool worker, written down once: shared by the worker's tasks and the scheduler.

```
<run folder>/pool/<worker>.worker.json  the scheduler's record: environment, tasks, executor, job id, start
<run folder>/pool/<worker>.retired      the worker is being (or has been) stopped: never handed another order
<run folder>/pool/<worker>/  the worker's own (the job user's, with PARITY_JOB_USER):
  submitit/              submitit's folder of the worker's own job (its pickles, its tasks' logs)
  heartbeat.rank<r>.json each task's state (starting, idle, busy, stopping), rewritten every second
  order.json             the one work order in force (created exclusively by the scheduler)
  cancel.json            "stop the order named here" (a run cancelled while warm)
  done.rank<r>.json      a task's report that its attempt child for an order has exited
  imported.rank<r>.json  a task's imports, once done: torch's and Megatron-Core's versions and what the harness
                         detects in the build, or the error that stopped it (a build's import check, read by
                         the scheduler: service/runs/import_check.py)
```

The hand-off is a file, not a socket: the scheduler writes the order to a temporary name and
hard-links it to `order.json`, which fails if an order is already there, so two scheduler replicas
can never give one worker two orders; the tasks stat `order.json` every POLL_S. Everything in here
is JSON read through jobs/protocol.py's bounded reads, never a pickle: a task writes data only.
Plain paths and JSON only: no torch, nothing from service/.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.protocol import UnreadableDocument, read_job_file

# A pool file is a few hundred bytes; anything larger is not one this harness wrote.
MAX_POOL_FILE_BYTES = 64 * 1024
POLL_S = 0.05
HEARTBEAT_S = 1.0


def _open_folder(folder: Path) -> int:
    """A descriptor of folder itself, refused when it is a link."""
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Create `name` in the open folder and write data, never through a link or into an existing file.

    The scheduler (root) writes into a worker's folder, which the job user owns: whatever the job
    planted under the temporary name (a link to a root-only file, a file it keeps open) is removed and
    a new file made with O_EXCL | O_NOFOLLOW, so the write lands only in a file this call created.
    """
    for _ in range(5):
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dir_fd)
        except FileExistsError:
            os.unlink(name, dir_fd=dir_fd)  # the entry itself (a link is removed, never its target)
            continue
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return
    raise FileExistsError(f"{name}: something keeps putting a file there")


def write_atomic(path: Path, value: dict[str, Any]) -> None:
    """Write JSON so a reader sees the old file or the whole new one, never half of it (nor through a link)."""
    tmp = f".{path.name}.{os.getpid()}.tmp"
    dir_fd = _open_folder(path.parent)
    try:
        _write_new(dir_fd, tmp, json.dumps(value).encode())
        os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a link, never its target
    finally:
        os.close(dir_fd)


def read_pool_file(path: Path) -> dict[str, Any] | None:
    """A pool file as a JSON object, or None when absent, unreadable, oversized or not an object."""
    try:
        value = json.loads(read_job_file(path, MAX_POOL_FILE_BYTES))
    except (OSError, UnreadableDocument, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class PoolFolder:
    """The files of one worker."""

    folder: Path

    @property
    def name(self) -> str:
        """The worker's name (its folder's name)."""
        return self.folder.name

    # The scheduler's own files sit beside the worker's folder, not in it: the folder is the job
    # user's while the worker lives, and a build that could rewrite its record could claim another
    # environment (and be handed other builds' runs) or un-retire itself.
    @property
    def record(self) -> Path:
        return self.folder.parent / f"{self.folder.name}.worker.json"

    @property
    def submitit(self) -> Path:
        return self.folder / "submitit"

    @property
    def order(self) -> Path:
        return self.folder / "order.json"

    @property
    def cancel(self) -> Path:
        return self.folder / "cancel.json"

    @property
    def retired(self) -> Path:
        return self.folder.parent / f"{self.folder.name}.retired"

    def heartbeat(self, rank: int) -> Path:
        return self.folder / f"heartbeat.rank{rank}.json"

    def imported(self, rank: int) -> Path:
        return self.folder / f"imported.rank{rank}.json"

    def done(self, rank: int) -> Path:
        return self.folder / f"done.rank{rank}.json"

    def place_order(self, order: dict[str, Any]) -> bool:
        """Hand the worker `order` unless it already holds one (exclusive, atomic); True when placed."""
        tmp = f".order.{os.getpid()}.{time.monotonic_ns()}.tmp"
        dir_fd = _open_folder(self.folder)  # the job user's folder: by descriptor, never through a link
        try:
            _write_new(dir_fd, tmp, json.dumps(order).encode())
            try:
                # fails with EEXIST when an order is in force (a link planted there counts as one)
                os.link(tmp, self.order.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def read_order(self) -> dict[str, Any] | None:
        return read_pool_file(self.order)

    def clear_order(self, order_id: str, tasks: int) -> None:
        """Take a finished order back: its reports first, the order last (the worker then reads idle)."""
        self.cancel.unlink(missing_ok=True)
        for rank in range(tasks):
            self.done(rank).unlink(missing_ok=True)
        current = self.read_order()
        if current is not None and current.get("id") == order_id:
            self.order.unlink(missing_ok=True)

    def beat_age(self, rank: int, now: float | None = None) -> float | None:
        """Seconds since task `rank` last wrote its heartbeat (None when it never did)."""
        try:
            mtime = os.stat(self.heartbeat(rank), follow_symlinks=False).st_mtime
        except OSError:
            return None
        return max(0.0, (now or time.time()) - mtime)

    def beats(self, tasks: int) -> list[dict[str, Any] | None]:
        return [read_pool_file(self.heartbeat(rank)) for rank in range(tasks)]

    def finished(self, order_id: str, tasks: int) -> bool:
        """Whether every task reported its attempt child for `order_id` gone."""
        reports = [read_pool_file(self.done(rank)) for rank in range(tasks)]
        return all(r is not None and r.get("order") == order_id for r in reports)
