"""The database drops the API's connections (a restart, a failover, a terminated backend): 503, never 500, never twice.

POST /runs' insert runs on psycopg's own cursor, past SQLAlchemy's disconnect handling. Against a
real uvicorn and the real Postgres, every backend of the test database is terminated between
requests, as a restart does:
- the next POST answers 503 `database_unavailable` (it was a 500, and each dead pooled connection
  failed one more request), the one after is queued: the pool was renewed at once;
- reads on the event loop's pool are all served: a dead connection is retried, its dead neighbours go;
- `parity submit` sends a POST whose outcome is unknown again with the same Idempotency-Key and
  exits 0, and the service holds one run, not two, also when the first send was committed and only
  its response was lost (a proxy that swallows it).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from sqlalchemy import func, make_url, select

from models import Run
from service.cli.main import main as parity
from service.core.db import session_scope
from service.core.tokens import create_token
from tests.plugins.tcp_proxy import pipe

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 4, "save_step": 2}

SUBMIT: list[str] = ["--config", str(SPEC["config"]), "--dp", str(SPEC["dp"]), "--steps", str(SPEC["steps"]),
          "--save-step", str(SPEC["save_step"])]


def _token() -> str:
    with session_scope() as session:
        return create_token(session, name="ci", scopes=["submit"], tracks=["*"])


def _terminate_backends(database_url: str) -> int:
    """End every other connection to the test database, as a restart would (each gets 57P01)."""
    plain = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    name = make_url(database_url).database
    with psycopg.connect(plain, autocommit=True) as db:
        row = db.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def _runs() -> int:
    with session_scope() as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def test_a_dropped_connection_is_a_503_once_and_the_next_post_is_queued(live_api: str, committed_db: str) -> None:
    headers = {"Authorization": f"Bearer {_token()}"}
    with httpx.Client(base_url=live_api, headers=headers, timeout=30) as client:
        for _ in range(2):  # the writer's pooled connection, used just now: no ping before its next use
            assert client.post("/api/v1/runs", json={"spec": SPEC}).status_code == 202
        assert _terminate_backends(committed_db) >= 1
        lost = client.post("/api/v1/runs", json={"spec": SPEC})
        assert lost.status_code == 503, lost.text
        # which pooled connection meets the dead backend first (the token's lookup or the insert) varies:
        # either way one clear 503 that names the database, never a 500
        assert lost.json()["error"] == "database_unavailable" and lost.json()["detail"].strip(), lost.text
        assert lost.headers["Retry-After"]
        after = [client.post("/api/v1/runs", json={"spec": SPEC}).status_code for _ in range(3)]
        assert after == [202, 202, 202]  # every dead neighbour went with the pool, not one request each
        assert client.get("/api/v1/runs/1").status_code == 200
    assert _runs() == 5  # the lost one was not queued


def test_reads_after_a_restart_are_a_503_at_most_once_although_many_pooled_connections_died(
    live_api: str, committed_db: str,
) -> None:
    # the first read to meet a dead connection is a 503 (Retry-After 1: the client sends it again) and
    # takes every dead neighbour out of the pool with it, so each later read is served
    from concurrent.futures import ThreadPoolExecutor

    headers = {"Authorization": f"Bearer {_token()}"}
    with httpx.Client(base_url=live_api, headers=headers, timeout=30) as client:
        assert client.post("/api/v1/runs", json={"spec": SPEC}).status_code == 202
    with ThreadPoolExecutor(16) as pool:  # a burst, so the pool holds several connections
        assert set(pool.map(lambda _: httpx.get(f"{live_api}/api/v1/runs/1", timeout=30).status_code,
                            range(160))) == {200}
    assert _terminate_backends(committed_db) >= 4
    with httpx.Client(base_url=live_api, timeout=30) as client:
        codes = [client.get("/api/v1/runs/1") for _ in range(10)]
    assert [c.status_code for c in codes[1:]] == [200] * 9
    assert codes[0].status_code == 200 or (codes[0].status_code == 503 and codes[0].headers["Retry-After"] == "1")


def test_submit_sends_again_after_a_dropped_connection_and_queues_one_run(
    live_api: str, committed_db: str, capsys: pytest.CaptureFixture[str],
) -> None:
    token = _token()
    with httpx.Client(base_url=live_api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        assert client.post("/api/v1/runs", json={"spec": SPEC}).status_code == 202
    assert _terminate_backends(committed_db) >= 1
    assert parity(["submit", "--url", live_api, "--token", token, *SUBMIT]) == 0
    err = capsys.readouterr().err
    assert "503" in err and "sending it again" in err and "same Idempotency-Key" in err
    assert _runs() == 2


class ResponseSwallower:
    """Forwards HTTP to a target; the first connection's request reaches it, its response never comes back."""

    def __init__(self, target: str) -> None:
        url = httpx.URL(target)
        self.target = (url.host, url.port or 80)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.swallowed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client, self.swallowed == 0), daemon=True).start()
            self.swallowed += 1

    def _serve(self, client: socket.socket, swallow: bool) -> None:
        upstream = socket.create_connection(self.target)
        if swallow:  # one whole request up, the response read (so the server has committed), then hang up
            request = _read_http(client)
            upstream.sendall(request)
            _read_http(upstream)
            for s in (client, upstream):
                s.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def _read_http(sock: socket.socket) -> bytes:
    """One HTTP message with a Content-Length body (what httpx and uvicorn send here)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body



@pytest.fixture
def swallower(live_api: str) -> Iterator[ResponseSwallower]:
    proxy = ResponseSwallower(live_api)
    yield proxy
    proxy.close()


def test_a_lost_response_is_sent_again_and_replayed_not_queued_twice(
    swallower: ResponseSwallower, committed_db: str, capsys: pytest.CaptureFixture[str],
) -> None:
    token = _token()
    assert parity(["submit", "--url", f"http://127.0.0.1:{swallower.port}", "--token", token, *SUBMIT]) == 0
    err = capsys.readouterr().err
    assert "sending it again" in err and swallower.swallowed == 2
    assert _runs() == 1  # the first send was committed; the second, with its key, returned that run
