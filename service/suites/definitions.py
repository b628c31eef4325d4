"""Suites: named, versioned lists of named checks. Applying changed checks stores a new version.

Each check's spec is validated as a run's would be when the suite is applied, so a suite that
applies can always be queued (on a build that lacks a feature a check then says unsupported-by-build).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Suite
from service.core.check_spec import run_spec_of
from service.core.errors import InvalidSpec, NotFound

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
MAX_CHECKS = 50
CHECK_KEYS = {"name", "spec", "why"}


def _invalid(field: str, message: str) -> InvalidSpec:
    return InvalidSpec(f"{field}: {message}", field=field)


def normalize_checks(checks: Any) -> list[dict[str, Any]]:
    """The checks as stored: each {"name", "spec" (canonical), "why"?}; 422 naming the first bad field."""
    if not isinstance(checks, list) or not 1 <= len(checks) <= MAX_CHECKS:
        raise _invalid("checks", f"a list of 1..{MAX_CHECKS} checks")
    out, seen = [], set()
    for i, check in enumerate(checks):
        field = f"checks[{i}]"
        if not isinstance(check, dict) or set(check) - CHECK_KEYS or not {"name", "spec"} <= set(check):
            raise _invalid(field, "expected {name, spec} (and optionally why)")
        name = check["name"]
        if not isinstance(name, str) or not NAME.match(name):
            raise _invalid(f"{field}.name", "1..100 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit)")
        if name in seen:
            raise _invalid(f"{field}.name", f"{name!r} appears twice")
        seen.add(name)
        if not isinstance(check["spec"], dict):
            raise _invalid(f"{field}.spec", "a run spec object")
        try:
            spec = run_spec_of(check["spec"]).to_dict()
        except InvalidSpec as exc:
            raise InvalidSpec(f"{field}.spec: {exc.detail}", field=f"{field}.{exc.field or 'spec'}") from None
        item: dict[str, Any] = {"name": name, "spec": spec}
        if check.get("why"):
            item["why"] = str(check["why"])[:1000]
        out.append(item)
    return out


def latest(session: Session, name: str, *, for_update: bool = False) -> Suite | None:
    """The newest version of the suite called name."""
    query = select(Suite).where(Suite.name == name).order_by(Suite.version.desc()).limit(1)
    return session.scalar(query.with_for_update() if for_update else query)


def apply_suite(session: Session, *, name: str, checks: Any, description: str = "",
                created_by: str | None = None) -> tuple[Suite, bool]:
    """Store the suite; unchanged checks and description keep the current version. -> (suite, new version)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise _invalid("name", "1..100 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit)")
    normalized = normalize_checks(checks)
    # one version at a time per name: concurrent applies queue on the advisory lock
    session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"suite:{name}"))))
    current = latest(session, name)
    if current is not None and current.checks == normalized and current.description == description:
        return current, False
    suite = Suite(name=name, version=(current.version + 1) if current else 1, description=description[:2000],
                  checks=normalized, created_by=created_by)
    session.add(suite)
    session.flush()
    return suite, True


def get_suite(session: Session, *, name: str, version: int | None = None) -> Suite:
    """A suite's given (default: newest) version, or 404."""
    if version is None:
        suite = latest(session, name)
    else:
        suite = session.scalar(select(Suite).where(Suite.name == name, Suite.version == version))
    if suite is None:
        raise NotFound(f"suite: unknown suite {name!r}" + (f" version {version}" if version else ""), field="suite")
    return suite


def list_suites(session: Session) -> list[Suite]:
    """The newest version of every suite, by name."""
    newest = select(Suite.name, func.max(Suite.version).label("v")).group_by(Suite.name).subquery()
    return list(session.scalars(select(Suite).join(
        newest, (Suite.name == newest.c.name) & (Suite.version == newest.c.v)).order_by(Suite.name)))


def suite_doc(suite: Suite) -> dict[str, Any]:
    """The API view of a suite version."""
    return {"name": suite.name, "version": suite.version, "description": suite.description,
            "checks": suite.checks, "created_by": suite.created_by, "created_at": suite.created_at.isoformat()}
