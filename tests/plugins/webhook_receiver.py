"""A real HTTP receiver on loopback for notification tests: records every POST, answers a set status."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class Receiver:
    """A running receiver: its URL, what it got, and the status it answers with."""

    server: ThreadingHTTPServer
    thread: threading.Thread
    got: list[Received] = field(default_factory=list)
    status: int = 200

    @property
    def url(self) -> str:
        """Base URL of the receiver."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        """Shut the server down and free its port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def start_receiver(port: int = 0) -> Receiver:
    """Start a receiver on 127.0.0.1:port (0 = any free port)."""
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver = holder["r"]
            receiver.got.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(receiver.status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    receiver = Receiver(server=server, thread=thread)
    holder["r"] = receiver
    thread.start()
    return receiver
