"""A loopback TCP proxy the tests can cut and restore, to take "the database" away for a while."""

from __future__ import annotations

import socket
import threading


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy src to dst until either ends, then shut both down."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Proxy:
    """Forwards 127.0.0.1:<port> to a target; `down()` drops every connection and refuses new ones."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.listener.listen(64)
        self.up = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def down(self) -> None:
        """Cut every open connection and refuse new ones."""
        self.up = False
        with self.lock:
            for conn in self.conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self.conns.clear()

    def restore(self) -> None:
        """Accept and forward connections again."""
        self.up = True

    def close(self) -> None:
        self.down()
        self.listener.close()
