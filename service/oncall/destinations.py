"""Where notifications may go: checked when a channel is added and again before every post.

A channel URL is chosen by whoever holds an admin token, but the scheduler is what connects: a URL
naming 127.0.0.1, the cloud metadata address or a private range would turn the scheduler into a
probe of the service's own network. Those are refused unless PARITY_NOTIFY_ALLOW_PRIVATE is set;
PARITY_NOTIFY_ALLOW_HOSTS (host names or .suffixes) narrows destinations further when set.
Channel URLs are credentials (a Slack incoming-webhook URL is one): responses show them masked.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit, urlunsplit

from service.core.settings import Settings


class BadDestination(ValueError):
    """The URL may not receive notifications; the message says why."""


def _allowed_host(host: str, allow: frozenset[str]) -> bool:
    return not allow or any(host == a or (a.startswith(".") and host.endswith(a)) for a in allow)


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise BadDestination(f"host {host!r} cannot be resolved ({exc})") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def check_destination(url: str, settings: Settings) -> None:
    """BadDestination unless url is http(s), on an allowed host, and resolves only to public addresses."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadDestination(f"expected an http(s) URL with a host, got {mask_url(url)!r}")
    host = parts.hostname.lower()
    if not _allowed_host(host, settings.notify_allow_host_set()):
        raise BadDestination(f"host {host!r} is not in PARITY_NOTIFY_ALLOW_HOSTS")
    for address in _addresses(host):
        if address.is_unspecified or address.is_multicast:
            raise BadDestination(f"host {host!r} resolves to {address}, which cannot receive notifications")
        if not address.is_global and not settings.notify_allow_private:
            raise BadDestination(
                f"host {host!r} resolves to {address} (loopback, link-local or private); "
                "set PARITY_NOTIFY_ALLOW_PRIVATE=1 to allow internal receivers")


def mask_url(url: str) -> str:
    """The URL without what may be a credential: user info, query, fragment and any path past the first part."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    segments = [s for s in parts.path.split("/") if s]
    path = f"/{segments[0]}/…" if len(segments) > 1 else (f"/{segments[0]}" if segments else "")
    return urlunsplit((parts.scheme, host, path, "…" if parts.query else "", ""))
