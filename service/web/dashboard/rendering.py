"""Jinja2 environment (autoescape always on), display filters, and the page-error type."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from jobs.verdict_names import FAILED, PASS
from service.core.verdicts import reading, run_label

HERE = Path(__file__).parent
STATIC = HERE / "static"

# No inline script or style may run: chart data travels as application/json blocks only.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


class PageError(Exception):
    """A dashboard page that cannot be shown: rendered as HTML with its status code."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def when(value: datetime | None) -> str:
    """Format a timestamp as UTC to the second."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def short_when(value: datetime | None) -> str:
    """A timestamp on one line of a list: month-day hour:minute UTC (the full one is in the title)."""
    return value.astimezone(UTC).strftime("%m-%d %H:%M") if value else "—"


def check_short(check_name: str | None, config: str = "") -> str:
    """A check's name without its config (already in the Config column): what sets this check apart."""
    rest = (check_name or "").removeprefix(config).strip()
    return rest or "defaults"


def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago a timestamp was, in the largest sensible unit."""
    if value is None:
        return "—"
    seconds = max(0.0, ((now or datetime.now(UTC)) - value).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def sci(value: float | None, digits: int = 2) -> str:
    """A float in scientific notation; exact zero stays "0"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return "0" if value == 0 else f"{value:.{digits}e}"


def num(value: float | None, digits: int = 6) -> str:
    """A float with a fixed number of significant digits."""
    return "—" if value is None else f"{value:.{digits}g}"


def duration(seconds: float | None) -> str:
    """Seconds as h/min/s."""
    if seconds is None:
        return "—"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{seconds:.1f} s"


def pretty(value: Any) -> str:
    """Indented JSON for evidence and probe details (escaped by the template like any text)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        # every template is HTML; escape by default whatever the file name says
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, age=age, sci=sci, num=num, duration=duration, pretty=pretty, vlabel=run_label,
                       short_when=short_when, check_short=check_short, reading=reading)
    # the verdict names (jobs/verdict_names.py) for the templates' comparisons: never spelled out there
    env.globals.update(PASS=PASS, FAILED=FAILED)
    return env


templates = Jinja2Templates(env=_environment())


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    """Render a template with the security headers every dashboard page carries."""
    # who is logged in (set by the dashboard's read dependency) drives the header and the CSRF fields
    context = {"viewer": getattr(request.state, "viewer", None), **context}
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def page_error(request: Request, exc: Exception) -> HTMLResponse:
    """Exception handler for PageError."""
    assert isinstance(exc, PageError)
    return render(request, "error.html", {"status": exc.status_code, "message": exc.message},
                  status_code=exc.status_code)
