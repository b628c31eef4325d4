"""A local build's only way out of its own network: a proxy to the package index hosts, and nowhere else.

Stdlib only: job_sandbox.py loads this file by path and starts it as root, before the job's network
namespace exists (nothing a job could have written is imported).

A build needs pip's index and nothing else of the network; the host's Postgres and API, a cloud's
metadata address and other tenants' ports are what a hostile install hook aims at (issue 44's row 5,
through a build). So a local build gets a network namespace of its own, as a phase does, and in it one
listening socket, 127.0.0.1:PORT, that this process, forked in the node's network, accepts on: it
answers `CONNECT host:port` for the hosts in its allow list only (exact names; ports 443 and 80 unless
an entry names its own, `host:port`), and 403 to everything else. A name is resolved once, here, and every
address it gives is checked before one is connected to (no second lookup a rebinding DNS could answer
otherwise): never the node (loopback, unspecified) or its link (link-local: a cloud's metadata address,
multicast), in IPv4 or IPv6 spelling (`::ffff:127.0.0.1` is the node); a private range (RFC 1918, CGNAT,
unique-local) only where the allow entry is that address itself, an operator's named mirror. pip, uv
and git reach it through HTTPS_PROXY (launcher.py sets it); plain-http requests are refused (501): an
index served over http needs the `network` isolation waived for builds (docs/security.md). Where the node
itself reaches the index only through a proxy (the service's HTTPS_PROXY), every tunnel goes through it.

It runs as nobody with no_new_privs, in the job's cgroup (its threads count against the job's pids
and memory caps, and it is killed with the job) and with PR_SET_PDEATHSIG (it dies with the job's
controller where there is no cgroup).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import pwd
import select
import signal
import socket
import threading
from collections.abc import Callable, Iterable

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
HEAD_MAX = 16 * 1024  # a CONNECT request's head; anything longer is not pip's
IDLE_S = 300.0  # a tunnel with no byte either way for this long is closed
MAX_TUNNELS = 64  # concurrent tunnels (pip opens a handful)
DEFAULT_PORTS = frozenset({80, 443})
# the node itself and its link: never a package index, whatever the allow list says
NODE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
    "::/128", "::1/128", "fe80::/10", "ff00::/8",
))
# other tenants' and the site's own networks: only an address the operator allowed by itself (listed here, not
# `not is_global`: that also takes in documentation and benchmark ranges a sandboxed host's index may sit in)
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
))
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_allow(entries: Iterable[str]) -> dict[str, frozenset[int]]:
    """{host: ports} from `host` (ports 80 and 443) or `host:port` entries, hosts lower-cased (names or
    IPv4 literals: settings.py checks the shape)."""
    out: dict[str, set[int]] = {}
    for raw in entries:
        host, sep, port = raw.strip().lower().partition(":")
        if host:
            out.setdefault(host, set()).update({int(port)} if sep and port.isdigit() else DEFAULT_PORTS)
    return {h: frozenset(p) for h, p in out.items()}


def target_of(head: bytes) -> tuple[str, str, int]:
    """(method, host, port) of a proxy request's first line; ValueError when it is not one."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1 request line: {line[:100]!r}")
    method, target = parts[0], parts[1]
    if method != "CONNECT":
        return method, "", 0
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"CONNECT needs host:port, got {target[:100]!r}")
    return method, host.strip("[]").lower(), int(port)


def _plain(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one stands for (mapped, compatible, NAT64, 6to4), else the address itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = int(address)
    if packed >> 32 == 0 and packed > 1:  # ::a.b.c.d (deprecated IPv4-compatible)
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    if address in ipaddress.ip_network("64:ff9b::/96"):  # NAT64's well-known prefix
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    return address


def refusal(host: str, address: IPAddress) -> str | None:
    """Why a tunnel to `host` may not go to `address` (None: it may)."""
    plain = _plain(address)
    shown = f"{address}" if plain == address else f"{address} ({plain})"
    if any(plain in net for net in NODE_NETWORKS if net.version == plain.version):
        return f"{host} resolves to {shown}, the node itself or its link"
    named = host == str(address) or host == str(plain)
    if not named and any(plain in net for net in PRIVATE_NETWORKS if net.version == plain.version):
        return f"{host} resolves to {shown}, a private network (allow the address itself to reach a mirror there)"
    return None


def resolve(host: str, port: int) -> tuple[str, int]:
    """The one address a tunnel to host:port connects to, every address the name gives checked first;
    PermissionError naming the address that may not be reached, OSError when it does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        why = refusal(host, ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
        if why:
            raise PermissionError(why)
    return str(infos[0][4][0]), port


def _answer(conn: socket.socket, status: str, why: str) -> None:
    body = f"parity index gateway: {why}\n".encode()
    try:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            raise ValueError("the client closed before its request ended")
        data += chunk
        if len(data) > HEAD_MAX:
            raise ValueError("request head too long")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _relay(a: socket.socket, b: socket.socket) -> None:
    a.settimeout(None)
    b.settimeout(None)
    while True:
        ready, _, _ = select.select([a, b], [], [], IDLE_S)
        if not ready:
            return
        for src in ready:
            data = src.recv(65536)
            if not data:
                return
            (b if src is a else a).sendall(data)


def _through(proxy: tuple[str, int], host: str, port: int) -> tuple[socket.socket, bytes]:
    """A tunnel to host:port through the node's own proxy (where the node reaches the index only through one),
    and what the far end already sent through it."""
    sock = socket.create_connection(proxy, timeout=30)
    try:
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head, rest = _read_head(sock)
    except (OSError, ValueError) as exc:
        sock.close()
        raise OSError(f"the node's proxy {proxy[0]}:{proxy[1]}: {exc}") from None
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if status.split(" ")[1:2] != ["200"]:
        sock.close()
        raise OSError(f"the node's proxy {proxy[0]}:{proxy[1]} answered {status[:100]!r}")
    return sock, rest


def handle(conn: socket.socket, allow: dict[str, frozenset[int]], proxy: tuple[str, int] | None = None) -> None:
    """One client connection: a tunnel to an allowed host (through the node's proxy when it has one), or a
    refusal naming why."""
    upstream = None
    try:
        conn.settimeout(30)
        try:
            head, rest = _read_head(conn)
            method, host, port = target_of(head)
        except (ValueError, OSError) as exc:
            _answer(conn, "400 Bad Request", str(exc))
            return
        if method != "CONNECT":
            _answer(conn, "501 Not Implemented", f"{method}: only CONNECT (https) reaches the package index")
            return
        if port not in allow.get(host, ()):
            _answer(conn, "403 Forbidden", f"{host}:{port} is not a package index this build may reach "
                                           "(PARITY_BUILD_HOSTS)")
            return
        try:
            # behind the node's proxy the proxy resolves (and the allow list has decided); else the checked address
            upstream, early = _through(proxy, host, port) if proxy else (
                socket.create_connection(resolve(host, port), timeout=30), b"")
        except PermissionError as exc:
            _answer(conn, "403 Forbidden", str(exc))
            return
        except OSError as exc:
            _answer(conn, "502 Bad Gateway", f"{host}:{port}: {exc}")
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n" + early)
        if rest:
            upstream.sendall(rest)
        _relay(conn, upstream)
    except OSError:
        pass
    finally:
        for s in (conn, upstream):
            if s is not None:
                s.close()


def serve(listener: socket.socket, allow: dict[str, frozenset[int]], proxy: tuple[str, int] | None = None) -> None:
    """Accept forever, each connection on a thread of its own (at most MAX_TUNNELS at once)."""
    slots = threading.BoundedSemaphore(MAX_TUNNELS)

    def one(conn: socket.socket) -> None:
        try:
            handle(conn, allow, proxy)
        finally:
            slots.release()

    while True:
        conn, _ = listener.accept()
        slots.acquire()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def _become_nobody(libc: ctypes.CDLL) -> None:
    try:
        entry = pwd.getpwnam("nobody")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 65534
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def parse_proxy(url: str | None) -> tuple[str, int] | None:
    """(host, port) of the node's own http:// proxy URL (https_proxy), None when there is none."""
    if not url:
        return None
    rest = url.split("://", 1)[1] if "://" in url else url
    host, _, port = rest.split("/", 1)[0].rsplit("@", 1)[-1].rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def start(allow: list[str], libc: ctypes.CDLL, proxy: str | None = None) -> Callable[[socket.socket], None]:
    """Fork the gateway here (still in the node's network); return what hands it the listening socket the
    caller makes once it is in the job's own network namespace. `proxy`: the node's own proxy URL, which
    every tunnel then goes through (the allow list still decides which)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the gateway: never returns
        code = 0
        try:
            ours.close()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # the job's log and pipes are not held open by the gateway
                os.dup2(null, fd)
            _become_nobody(libc)
            # after the drop: a change of credentials clears the parent-death signal
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the job's controller is already gone
                os._exit(0)
            _, fds, _, _ = socket.recv_fds(theirs, 16, 1)
            theirs.close()
            if not fds:
                os._exit(0)
            serve(socket.socket(fileno=fds[0]), parse_allow(allow), parse_proxy(proxy))
        except BaseException:
            code = 1
        os._exit(code)
    theirs.close()

    def hand(listener: socket.socket) -> None:
        socket.send_fds(ours, [b"l"], [listener.fileno()])
        ours.close()
        listener.close()

    return hand


def listen(port: int) -> socket.socket:
    """The job's end: 127.0.0.1:port in the job's own network namespace."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener
