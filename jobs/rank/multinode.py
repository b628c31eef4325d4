"""Rendezvous across Slurm nodes: the first node's address for MASTER_ADDR, and gloo's interface.

submitit names the first node of the allocation as MASTER_ADDR by its hostname, which other nodes
may not resolve (and which must never be loopback). Slurm itself reaches a node at its NodeAddr, so
that is what peers dial. Gloo binds each rank to the address its hostname resolves to, or falls back
to loopback, which a peer on another node cannot reach; so the interface that routes to the master
is named in GLOO_SOCKET_IFNAME (unless the site set it already).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import subprocess

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


def job_nodes() -> int:
    """The number of nodes of this Slurm job (1 outside Slurm)."""
    raw = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    try:
        return max(1, int(raw))
    except ValueError:
        return 1


def node_address(node: str) -> str:
    """Where Slurm reaches `node` (its NodeAddr), else the name itself."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return node
    found = re.search(r"\bNodeAddr=(\S+)", out.stdout)
    return found.group(1) if out.returncode == 0 and found else node


def route_source(address: str) -> str | None:
    """The local IPv4 address this host sends from to reach `address` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def interface_of(address: str) -> str | None:
    """The name of the local interface holding IPv4 `address`, if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def resolves(name: str) -> bool:
    """Whether this host can look `name` up (an IPv4 or IPv6 address)."""
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def keep_local_master() -> None:
    """On a one-node job: submitit's MASTER_ADDR (this node's hostname) as it is, or loopback if it does not resolve.

    Every rank of a one-node job runs on this host, so loopback reaches rank 0's store; a node whose
    own name is in no resolver (the namespaces cluster of scripts/slurm-multinode-up.sh) would
    otherwise retry the lookup until the rendezvous times out.
    """
    if not resolves(os.environ["MASTER_ADDR"]):
        os.environ["MASTER_ADDR"] = "127.0.0.1"


def export_multinode_env() -> dict[str, str]:
    """On a job spanning nodes: point MASTER_ADDR at the first node's address and pick gloo's interface.

    Call after submitit's export (which set MASTER_ADDR to the first node's hostname). Returns what
    it set, for the phase document; nothing on a one-node job (which keeps the hostname, or takes
    loopback when the hostname does not resolve: keep_local_master).
    """
    if "MASTER_ADDR" not in os.environ:
        return {}
    if job_nodes() < 2:
        keep_local_master()
        return {}
    first = os.environ["MASTER_ADDR"]
    master = node_address(first)
    os.environ["MASTER_ADDR"] = master
    out = {"master_node": first, "master_addr": master}
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        source = route_source(master)
        ifname = interface_of(source) if source else None
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        out["gloo_socket_ifname"] = os.environ["GLOO_SOCKET_IFNAME"]
    return out
