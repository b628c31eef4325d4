"""Where the service is and which token to send, read straight from PARITY_* variables.

The client commands read these without the service's settings object, so the base install (the
client) needs no pydantic-settings; the defaults are the service's own (service/core/settings.py).
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx


def service_url(arg: str | None = None) -> str:
    """--url, else PARITY_SERVICE_URL, else PARITY_PUBLIC_URL, else PARITY_API_HOST:PARITY_API_PORT."""
    url = arg or os.environ.get("PARITY_SERVICE_URL") or os.environ.get("PARITY_PUBLIC_URL")
    if not url:
        url = f"http://{os.environ.get('PARITY_API_HOST', '127.0.0.1')}:{os.environ.get('PARITY_API_PORT', '8000')}"
    return url.rstrip("/")


def token(arg: str | None = None) -> str | None:
    """--token, else PARITY_TOKEN."""
    return arg or os.environ.get("PARITY_TOKEN") or None


def service_target(args: argparse.Namespace, command: str) -> tuple[str, str | None]:
    """The service URL and token a client command uses: --url/--token, else PARITY_SERVICE_URL/PARITY_TOKEN;
    says on stderr which one is missing and what is used instead."""
    url = getattr(args, "url", None) or os.environ.get("PARITY_SERVICE_URL")
    if not url:
        url = _recorded_serve_url() or service_url()
        print(f"parity {command}: PARITY_SERVICE_URL is not set (nor --url); trying {url}", file=sys.stderr)
    bearer = token(getattr(args, "token", None))
    if not bearer:
        print(f"parity {command}: PARITY_TOKEN is not set (nor --token); sending no token", file=sys.stderr)
    return url.rstrip("/"), bearer


def _recorded_serve_url() -> str | None:
    """The address a `parity serve` on this host's run folder recorded (only where the service is installed)."""
    try:
        from service.core.links import recorded_url
        from service.core.settings import get_settings
    except ImportError:  # the client alone: no run folder to look in
        return None
    try:
        return recorded_url(get_settings())
    except Exception:  # noqa: BLE001 - unreadable settings: fall back to the defaults
        return None


def add_client_args(p: argparse.ArgumentParser) -> None:
    """--url and --token on a command that talks to the service."""
    p.add_argument("--url", help="service URL (default PARITY_SERVICE_URL)")
    p.add_argument("--token", help="bearer token (default PARITY_TOKEN)")


def http_client(args: argparse.Namespace, *, timeout: float = 300) -> httpx.Client:
    """An HTTP client for the service named by --url/--token or the environment."""
    bearer = token(getattr(args, "token", None))
    return httpx.Client(base_url=service_url(getattr(args, "url", None)),
                        headers={"Authorization": f"Bearer {bearer}"} if bearer else {}, timeout=timeout)
