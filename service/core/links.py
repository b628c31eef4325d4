"""Every link the service emits starts here: PARITY_PUBLIC_URL, else the request's own host."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.core.settings import Settings, get_settings


def public_base(settings: Settings, request: Request | None = None) -> str:
    """The base URL for links: the configured public URL, else the host the request came to."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    if request is not None:
        # behind a proxy, uvicorn's --proxy-headers makes this the client-facing host
        return str(request.base_url).rstrip("/")
    # no request (the scheduler's notifications): the address `parity serve` listens on
    return settings.base_url


def _base(request: Request) -> str:
    return public_base(get_settings(), request)


BaseUrl = Annotated[str, Depends(_base)]


def run_url(base: str, run_id: int, page: str = "") -> str:
    """Dashboard link of a run ('' for its page, 'triage' for its triage page)."""
    return f"{base}/runs/{run_id}" + (f"/{page}" if page else "")


def regression_url(base: str, regression_id: int) -> str:
    """Dashboard link of a regression."""
    return f"{base}/regressions/{regression_id}"
