"""TCP ports other users' processes listen on, read from the kernel's socket tables (/proc/net/tcp*)."""

from __future__ import annotations

import os
from pathlib import Path

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN, as the table prints it


def ports_listened_on_by_others() -> frozenset[int]:
    """Ports a socket owned by a uid other than ours listens on, in this network namespace.

    Our own listeners stay out: a rank deriving the job's rendezvous port after rank 0 bound it must
    still get that port. An unreadable table counts as empty (the caller then keeps its first pick).
    """
    own = os.geteuid()
    held: set[int] = set()
    for table in TCP_TABLES:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
            if len(fields) < 8 or fields[3] != LISTEN or not fields[7].isdigit() or int(fields[7]) == own:
                continue
            try:
                held.add(int(fields[1].rsplit(":", 1)[1], 16))
            except (IndexError, ValueError):
                continue
    return frozenset(held)
