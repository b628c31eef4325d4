"""The build's index gateway (service/executors/index_gateway.py) on its own: what it lets through, what it
refuses and why, on a real socket pair in this process (no namespace: the job's end is a plain listener)."""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest

from service.core.settings import Settings
from service.executors import index_gateway


def test_allow_entries_are_hosts_with_the_web_ports_or_one_named_port() -> None:
    allow = index_gateway.parse_allow(["PyPI.org", "mirror.internal:8443", " "])
    assert allow == {"pypi.org": frozenset({80, 443}), "mirror.internal": frozenset({8443})}


@pytest.mark.parametrize("head", [b"GET / HTTP/1.1", b"CONNECT pypi.org HTTP/1.1", b"CONNECT :443 HTTP/1.1",
                                  b"CONNECT pypi.org:443 SPDY/3", b"\x00\x01"])
def test_a_request_that_names_no_host_and_port_is_read_as_such(head: bytes) -> None:
    if head.startswith(b"GET"):
        assert index_gateway.target_of(head) == ("GET", "", 0)
        return
    with pytest.raises(ValueError):
        index_gateway.target_of(head)


def _ask(allow: list[str], request: bytes) -> bytes:
    listener = socket.create_server(("127.0.0.1", 0))
    server = threading.Thread(target=lambda: index_gateway.handle(listener.accept()[0],
                                                                   index_gateway.parse_allow(allow)), daemon=True)
    server.start()
    with socket.create_connection(listener.getsockname(), timeout=10) as client:
        client.sendall(request)
        answer = client.recv(4096)
    server.join(10)
    listener.close()
    return answer


def test_the_gateway_refuses_the_node_other_hosts_and_plain_http() -> None:
    with socket.create_server(("127.0.0.1", 0)) as node_service:  # stands for the node's Postgres
        port = node_service.getsockname()[1]
        assert _ask(["pypi.org"], f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()).startswith(b"HTTP/1.1 403")
        # allowed by name, yet the node itself: still refused
        refused = _ask([f"localhost:{port}"], f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
        assert refused.startswith(b"HTTP/1.1 403") and b"the node itself" in refused
    assert _ask(["pypi.org"], b"CONNECT pypi.org:22 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    assert _ask(["pypi.org"], b"GET http://pypi.org/simple/ HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 501")
    assert _ask(["pypi.org"], b"CONNECT pypi.org:443 HTTP/1.1\r\n" + b"x" * 20000).startswith(b"HTTP/1.1 400")


def test_build_hosts_are_checked_and_the_environments_indexes_added(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="PARITY_BUILD_HOSTS: 'http://pypi.org'"):
        Settings(build_hosts=["http://pypi.org"])
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example:8443/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/pypi/simple https://extra.example/simple")
    assert Settings(build_hosts=["PyPI.org"]).build_hosts_allowed() == [
        "extra.example", "mirror.example:8443", "pypi.org"]


def test_a_node_behind_a_proxy_tunnels_through_it_and_the_allow_list_still_decides() -> None:
    """The node's own proxy (HTTPS_PROXY of the service) carries every tunnel; a host outside the allow list is
    refused before the proxy is asked; a proxy that refuses is a 502 naming it."""
    asked: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as node_proxy:
        def answer(status: bytes) -> None:
            conn, _ = node_proxy.accept()
            with conn:
                asked.append(conn.recv(4096).split(b"\r\n", 1)[0])
                conn.sendall(status + b"\r\n\r\n")
                if status.endswith(b"200 OK"):
                    conn.sendall(b"index bytes")

        proxy = f"http://127.0.0.1:{node_proxy.getsockname()[1]}"
        assert index_gateway.parse_proxy(proxy) == ("127.0.0.1", node_proxy.getsockname()[1])
        for status in (b"HTTP/1.1 200 OK", b"HTTP/1.1 403 Forbidden"):
            server = threading.Thread(target=answer, args=(status,), daemon=True)
            server.start()
            with socket.create_server(("127.0.0.1", 0)) as listener:
                job_end = threading.Thread(target=lambda: index_gateway.handle(
                    listener.accept()[0], index_gateway.parse_allow(["pypi.org"]),
                    index_gateway.parse_proxy(proxy)), daemon=True)
                job_end.start()
                with socket.create_connection(listener.getsockname(), timeout=10) as client:
                    client.sendall(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n")
                    got = b""
                    while len(got) < 60 and (chunk := client.recv(4096)):
                        got += chunk
                job_end.join(10)
            server.join(10)
            if status.endswith(b"200 OK"):
                assert got == b"HTTP/1.1 200 Connection established\r\n\r\nindex bytes", got
            else:
                assert got.startswith(b"HTTP/1.1 502") and b"answered 'HTTP/1.1 403 Forbidden'" in got, got
    assert asked == [b"CONNECT pypi.org:443 HTTP/1.1"] * 2
    assert _ask(["pypi.org"], b"CONNECT example.com:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    assert index_gateway.parse_proxy("http://user:pw@proxy.corp:3128/") == ("proxy.corp", 3128)
    assert index_gateway.parse_proxy("") is None and index_gateway.parse_proxy("http://proxy.corp") is None


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "0.0.0.0", "::1", "::", "169.254.169.254", "fe80::1", "224.0.0.1",
    # the node in IPv6 spelling: mapped, compatible, 6to4 and NAT64 forms of its loopback and metadata address
    "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "2002:7f00:1::", "64:ff9b::7f00:1",
])
def test_the_node_and_its_link_are_refused_in_every_spelling(address: str) -> None:
    assert index_gateway.refusal("mirror.example", ipaddress.ip_address(address))
    assert index_gateway.refusal(address, ipaddress.ip_address(address))  # even when allowed by that address


@pytest.mark.parametrize("address", ["10.1.2.3", "172.20.0.5", "192.168.1.1", "100.64.0.9", "fd00::5",
                                     "::ffff:10.1.2.3"])
def test_a_private_address_only_when_the_operator_allowed_it_by_itself(address: str) -> None:
    assert "private network" in str(index_gateway.refusal("mirror.example", ipaddress.ip_address(address)))
    plain = address.removeprefix("::ffff:")
    assert index_gateway.refusal(plain, ipaddress.ip_address(address)) is None


def test_a_public_index_address_passes() -> None:
    assert index_gateway.refusal("pypi.org", ipaddress.ip_address("151.101.0.223")) is None
    assert index_gateway.refusal("pypi.org", ipaddress.ip_address("2a04:4e42::223")) is None


def test_a_name_that_resolves_to_the_node_in_ipv6_spelling_is_refused_before_any_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An allowed name whose DNS answers ::ffff:127.0.0.1 (the node, through the IPv4-mapped form): the review's
    case. The node's service listens; the gateway must answer 403 and never connect to it."""
    with socket.create_server(("127.0.0.1", 0)) as node_service:
        port = node_service.getsockname()[1]
        node_service.settimeout(0.5)
        real = socket.getaddrinfo

        def dns(host: str, *args, **kwargs):  # type: ignore[no-untyped-def]
            if host == "mirror.example":  # the hostile answer, as the name's DNS would give it
                return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:127.0.0.1", port, 0, 0))]
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", dns)
        answer = _ask([f"mirror.example:{port}"], f"CONNECT mirror.example:{port} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 403") and b"(127.0.0.1), the node itself" in answer, answer
        with pytest.raises(TimeoutError):
            node_service.accept()  # nothing reached the node's service
