"""Suites: named, versioned lists of named checks. Applying changed checks stores a new version.

Each check's spec is the API's one `CheckSpec` (as POST /runs and /bisects take it), parsed with the
request body, so a suite that applies can always be queued (on a build that lacks a feature a check
then says unsupported-by-build) and /openapi.json states what a suite's check may hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Suite
from service.core.check_spec import CheckSpec
from service.core.errors import InvalidSpec, NotFound

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
MAX_CHECKS = 50
MAX_WHY = 1000


class SuiteCheck(BaseModel):
    """One check of a suite: a readable name, the run spec it stands for, and why it is in the suite."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME.pattern, max_length=100,
                      description="1..100 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit)")
    spec: CheckSpec = Field(description="The check's run spec (as POST /runs takes)")
    why: str = Field(default="", max_length=MAX_WHY, description="What the check guards")


def _invalid(field: str, message: str) -> InvalidSpec:
    return InvalidSpec(f"{field}: {message}", field=field)


def stored_checks(checks: Sequence[SuiteCheck]) -> list[dict[str, Any]]:
    """The checks as stored: each {"name", "spec" (canonical), "why"?}; 422 naming a name used twice."""
    out, seen = [], set()
    for i, check in enumerate(checks):
        if check.name in seen:
            raise _invalid(f"checks[{i}].name", f"{check.name!r} appears twice")
        seen.add(check.name)
        item: dict[str, Any] = {"name": check.name, "spec": check.spec.run_spec.to_dict()}
        if check.why:
            item["why"] = check.why
        out.append(item)
    return out


def locate_spec_error(checks: Any, error: InvalidSpec) -> InvalidSpec:
    """The error of a check's spec, named by the check it is in (`checks[1].spec.dp`): the body's parse
    stops at the first bad spec without saying which check held it, so find it."""
    for i, check in enumerate(checks if isinstance(checks, list) else []):
        try:
            CheckSpec.model_validate(check.get("spec") if isinstance(check, dict) else None)
        except InvalidSpec as exc:
            return InvalidSpec(f"checks[{i}].{exc.detail}", field=f"checks[{i}].{exc.field or 'spec'}")
    return error


def latest(session: Session, name: str, *, for_update: bool = False) -> Suite | None:
    """The newest version of the suite called name."""
    query = select(Suite).where(Suite.name == name).order_by(Suite.version.desc()).limit(1)
    return session.scalar(query.with_for_update() if for_update else query)


def apply_suite(session: Session, *, name: str, checks: Sequence[SuiteCheck], description: str = "",
                created_by: str | None = None) -> tuple[Suite, bool]:
    """Store the suite; unchanged checks and description keep the current version. -> (suite, new version)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise _invalid("name", "1..100 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit)")
    if not 1 <= len(checks) <= MAX_CHECKS:
        raise _invalid("checks", f"a list of 1..{MAX_CHECKS} checks")
    normalized = stored_checks(checks)
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
