"""What a local job starts in: run as root, it builds the job's namespaces, then drops to the job's user and execs.

`python -I job_sandbox.py SPEC -- COMMAND…` (stdlib only: it runs as root before anything of the job, with
no import path a job could have written). SPEC is JSON (`sandbox_command` makes it):

- `cgroups`: the `cgroup.procs` files it moves itself into first (v2 for the kill, v1 pids/memory where the
  limits live there: job_cgroup.py), so every process the job ever starts is inside them;
- `network`: a network namespace of its own with only loopback up: the host's Postgres and API, other jobs'
  rendezvous ports, the outside are not there (every rank of a local job is a child of this one process, so
  they share it);
- `gateway` (a build, with `network`): {"port", "allow"}: the build's only way out, a proxy on 127.0.0.1:port
  in its namespace that reaches the package index hosts in `allow` and nothing else (index_gateway.py,
  forked here before the namespace is made);
- `mounts`: a mount namespace of its own, where `/tmp` and `/var/tmp` are folders of the job's (counted in
  its disk quota), `/dev/shm` and `/run` tmpfs of `shm_size` bytes (counted in its memory: the node's service
  sockets under `/run`, `/var/run` with it, are not there), all nosuid,nodev, and its
  granted folders (`writable`) remounted nosuid,nodev on themselves: nothing it writes can be setuid or a
  device, and nothing it leaves in the node's `/tmp`, `/var/tmp` or `/dev/shm` exists after it. What the job
  must reach below one of those (`keep`: its interpreter, the checkout, the run folder, when they live under
  `/tmp`) is bound back in from the node's, at the same path; and an IPC namespace of its own: the SysV shared
  memory, semaphores and message queues (and POSIX message queues) it makes die with its last process;
- always: `no_new_privs` (no exec gains a privilege: a setuid file anywhere is an ordinary one to the job),
  then the drop to `uid`/`gid` with no supplementary groups.

Any step that fails ends it with exit status 111 and the step named on stderr, before the job runs: a
promised isolation is never skipped here (the scheduler waives one only by leaving it out of SPEC).
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import os
import socket
import struct
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x40000000, 0x08000000
MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
FAILED = 111
# the node's shared, world-writable folders, and /run, where the node's services keep their Unix sockets (the
# host's Postgres at /run/postgresql trusts local connections on many hosts; a socket is no network, so the job's
# own network namespace does not hide it): the job gets its own of each
HIDDEN = ("/tmp", "/var/tmp", "/dev/shm", "/run")

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(RuntimeError):
    """A step of the job's isolation could not be made (the job must not start)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {source} on {target}")


def loopback_up() -> None:
    """Bring `lo` up in this (new) network namespace: the only interface a job has."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _nosuid(target: str) -> None:
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)


def _kept_entries(hidden: str, keep: list[str]) -> list[str]:
    """The entries right below `hidden` that a kept path lies in (each bound back whole, once)."""
    out: list[str] = []
    for path in keep:
        rel = os.path.relpath(path, hidden)
        if rel == "." or rel.startswith(".."):
            continue
        first = rel.split(os.sep, 1)[0]
        if first not in out:
            out.append(first)
    return out


def private_mounts(spec: dict[str, Any]) -> None:
    """The job's own /tmp, /var/tmp and /dev/shm (nosuid,nodev), with what it needs below them bound back."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the node, nor the other way
    folders = dict(spec["folders"])
    keep = [os.path.realpath(str(p)) for p in spec.get("keep", [])]
    # every source opened before the first mount: a later mount must not change what a path names
    old = {h: os.open(h, os.O_PATH | os.O_DIRECTORY) for h in HIDDEN if os.path.isdir(h) and not os.path.islink(h)}
    sources = {h: os.open(folders[h], os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW) for h in folders if h in old}
    for hidden in old:
        if hidden in sources:
            _mount(f"/proc/self/fd/{sources[hidden]}", hidden, None, MS_BIND)
            _nosuid(hidden)
        else:
            _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(spec['shm_size'])},mode=1777")
    for hidden in old:
        for entry in _kept_entries(os.path.realpath(hidden), keep):
            source = f"/proc/self/fd/{old[hidden]}/{entry}"
            target = os.path.join(hidden, entry)
            if not os.path.exists(source):
                continue  # not made yet (an artifact folder before the first upload): nothing to reach
            if os.path.isdir(source):
                os.makedirs(target, exist_ok=True)
            elif not os.path.exists(target):
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            _mount(source, target, None, MS_BIND | MS_REC)
            _nosuid(target)
    for fd in [*old.values(), *sources.values()]:
        os.close(fd)
    for folder in spec.get("writable", []):
        _mount(str(folder), str(folder), None, MS_BIND | MS_REC)
        _nosuid(str(folder))


def _gateway() -> Any:
    """index_gateway.py, loaded by path from beside this file (run with -I, nothing is on the import path)."""
    module = sys.modules.get("index_gateway")
    if module is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "index_gateway.py")
        found = importlib.util.spec_from_file_location("index_gateway", path)
        if found is None or found.loader is None:
            raise SandboxError(f"no index gateway at {path}")
        module = importlib.util.module_from_spec(found)
        sys.modules["index_gateway"] = module
        found.loader.exec_module(module)
    return module


def enter(spec: dict[str, Any]) -> None:
    """Every step of SPEC, in order, in this process (root); it is then the job's to exec."""
    for procs in spec.get("cgroups", []):
        with open(str(procs), "w") as fh:
            fh.write(str(os.getpid()))
    flags = (CLONE_NEWNS | CLONE_NEWIPC if spec.get("mounts") else 0) | (CLONE_NEWNET if spec.get("network") else 0)
    gateway: dict[str, Any] = spec.get("gateway") or {} if spec.get("network") else {}
    # forked in the node's network
    hand = _gateway().start(list(gateway["allow"]), _libc, gateway.get("proxy")) if gateway else None
    if flags:
        _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    if spec.get("network"):
        loopback_up()
    if hand is not None:
        hand(_gateway().listen(int(gateway["port"])))
    if spec.get("mounts"):
        private_mounts(spec)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if spec.get("uid") is not None:
        os.setgroups([])
        os.setresgid(int(spec["gid"]), int(spec["gid"]), int(spec["gid"]))
        os.setresuid(int(spec["uid"]), int(spec["uid"]), int(spec["uid"]))


def main(argv: list[str]) -> int:
    """Enter the sandbox SPEC names, then exec COMMAND (exit 111 naming the step that failed)."""
    if len(argv) < 4 or argv[2] != "--":
        print("usage: job_sandbox.py SPEC -- COMMAND...", file=sys.stderr)
        return 2
    try:
        enter(json.loads(argv[1]))
        os.execvp(argv[3], argv[3:])
    except (SandboxError, OSError, ValueError, KeyError) as exc:
        print(f"parity job sandbox: {exc}", file=sys.stderr)
    return FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
