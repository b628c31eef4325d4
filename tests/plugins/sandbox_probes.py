"""Job payloads that try what the review's hostile builds did from inside a local job (issue 44): gain a
privilege through a setuid file, reach the node's Postgres, squat a port, fork and allocate without end.
A module of its own so a test can pickle it by value for a job user that cannot import the checkout's tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path


def try_to_gain(setuid_id: str, port: int, forks: int) -> dict[str, object]:
    """Everything a job may try at once; each outcome as data (the test judges)."""
    out: dict[str, object] = {"uid": os.getuid()}
    status = Path("/proc/self/status").read_text()
    out["no_new_privs"] = next(line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs"))
    # a setuid-root program the host has: run, it must not make this job root
    ran = subprocess.run([setuid_id, "-u"], capture_output=True, text=True)
    out["setuid_euid"] = ran.stdout.strip()
    # the review's setuid shells: made here, each must be useless and gone with the job
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        copy = Path(folder, f"sh-{os.getpid()}")
        shutil.copy("/bin/sh", copy)
        os.chmod(copy, 0o6755)
        flags = os.statvfs(copy).f_flag
        out[f"nosuid {folder}"] = bool(flags & os.ST_NOSUID and flags & os.ST_NODEV)
    # the node's Postgres and the port the test holds on the node's loopback
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=3).close()
        out["postgres"] = "connected"
    except OSError as exc:
        out["postgres"] = type(exc).__name__
    # the node's services by their Unix sockets (no network needed): the host's Postgres trusts them here
    out["node sockets"] = sorted(str(p) for folder in ("/run", "/var/run") if os.path.isdir(folder)
                                 for p in _walk(Path(folder)) if p.is_socket())
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect("/var/run/postgresql/.s.PGSQL.5432")
            out["postgres socket"] = "connected"
        except OSError as exc:
            out["postgres socket"] = type(exc).__name__
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            out["bind"] = "bound"
        except OSError as exc:
            out["bind"] = exc.strerror
    # processes without end: how many live at once before the cap says no
    children = []
    try:
        for _ in range(forks):
            children.append(subprocess.Popen(["sleep", "30"]))
    except OSError as exc:
        out["fork_refused"] = exc.strerror
    out["forked"] = len(children)
    for child in children:
        child.kill()
        child.wait()
    # memory without end, in a child (the cap's OOM kill must not take the answer with it)
    hog = subprocess.run([sys.executable, "-c", "b = bytearray(768 << 20); b[::4096] = b'x' * len(b[::4096])"],
                         capture_output=True)
    out["hog"] = hog.returncode
    return out


def _walk(folder: Path) -> list[Path]:
    found = []
    for root, _dirs, files in os.walk(folder, onerror=lambda exc: None):
        found += [Path(root, name) for name in files]
    return found


def leave_files(shared: str) -> list[str]:
    """Files, a folder and a setuid shell in the node's shared folders, as a job whose /tmp is the node's."""
    made = []
    for folder in ("/tmp", "/var/tmp", "/dev/shm", shared):
        mine = Path(folder, f"left-{os.getpid()}")
        mine.mkdir()
        shutil.copy("/bin/sh", mine / "sh")
        os.chmod(mine / "sh", 0o6755)
        (Path(folder) / f"left-{os.getpid()}.txt").write_text("x")
        made += [str(mine), str(Path(folder) / f"left-{os.getpid()}.txt")]
    return made


def no_new_privs() -> str:
    """This process's NoNewPrivs flag, as /proc says it ("1": no exec gains a privilege)."""
    status = Path("/proc/self/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs"))


def reach_from_a_build(index_host: str) -> dict[str, str]:
    """What a build's install hook can reach: the node's Postgres directly and through the build's proxy,
    a host that is no package index, and the index itself (each answer's first line, or the error's name)."""
    out: dict[str, str] = {"proxy": os.environ.get("HTTPS_PROXY", "")}
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=3).close()
        out["postgres"] = "connected"
    except OSError as exc:
        out["postgres"] = type(exc).__name__
    proxy = out["proxy"].rsplit("/", 1)[-1].rpartition(":")
    for name, target in (("postgres via proxy", "127.0.0.1:5432"), ("localhost via proxy", "localhost:443"),
                         ("other host via proxy", "example.com:443"), ("index via proxy", f"{index_host}:443")):
        try:
            with socket.create_connection((proxy[0], int(proxy[2])), timeout=30) as sock:
                sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                out[name] = sock.recv(200).split(b"\r\n", 1)[0].decode()
        except (OSError, ValueError) as exc:
            out[name] = type(exc).__name__
    return out


def leave_ipc() -> list[int]:
    """A SysV shared memory segment, semaphore set and message queue, each under a key of its own, left behind
    (they outlive every process): the keys, for the test to look for on the node."""
    import ctypes
    import random

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_creat = 0o1000
    keys = [random.randrange(1 << 20, 1 << 30) for _ in range(3)]
    made = [libc.shmget(keys[0], 4096, ipc_creat | 0o666), libc.semget(keys[1], 1, ipc_creat | 0o666),
            libc.msgget(keys[2], ipc_creat | 0o666)]
    if min(made) < 0:
        raise OSError(ctypes.get_errno(), f"SysV IPC not made: {made}")
    return keys


def controller_descriptors() -> dict[str, str]:
    """What the rank's controller (its parent) holds open, by descriptor number: a rank of the same uid can take
    any of them (pidfd_getfd), so each is a way out of the job."""
    ppid = os.getppid()
    out: dict[str, str] = {"controller": Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode()}
    for fd in os.listdir(f"/proc/{ppid}/fd"):
        try:
            out[fd] = os.readlink(f"/proc/{ppid}/fd/{fd}")
        except OSError as exc:
            out[fd] = type(exc).__name__
    return out


def link_out(attempt: str) -> list[str]:
    """A file in the job's own folder, hard-linked into the node's /var/tmp and /tmp (its own inode, 0666): the
    review's way to outlive the lease once the take-back re-owned the shared inode."""
    inside = Path(attempt) / f"linked-{os.getpid()}.txt"
    inside.write_text("the job's bytes")
    os.chmod(inside, 0o666)
    out = [str(inside)]
    for folder in ("/var/tmp", "/tmp"):
        outside = Path(folder) / f"parity-linked-{os.getpid()}"
        os.link(inside, outside)
        out.append(str(outside))
    return out
