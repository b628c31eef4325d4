"""Reading a file a job or build wrote: inside its folder, never through a symlink, bounded.

Whatever a build or job writes is hostile: `build.log` may be a symlink to a service secret or to
/proc/self/environ, a FIFO that blocks the reader, or a file of many gigabytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeFile(Exception):
    """The file is missing, not a regular file, or reached through a symlink; the message says which."""


def read_tail(folder: Path, name: str, max_bytes: int) -> bytes:
    """The last max_bytes of folder/name, a regular file directly inside folder, opened with O_NOFOLLOW."""
    if not name or "/" in name or name in (".", ".."):
        raise UnsafeFile(f"{name!r} is not a plain file name")
    flags = os.O_RDONLY | os.O_NOFOLLOW
    try:
        # the folder too: a build that swapped its own folder for a link to / must not get / read
        dir_fd = os.open(folder, flags | os.O_DIRECTORY)
    except OSError as exc:
        raise UnsafeFile(f"folder cannot be opened ({exc.strerror})") from None
    try:
        fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafeFile(f"{name} cannot be opened ({exc.strerror})") from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{name} is not a regular file")
        fh.seek(max(0, info.st_size - max_bytes))
        return fh.read(max_bytes)
