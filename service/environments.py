"""Environments: which Python runs the job phases (so CI can test another Megatron-Core build)."""

from __future__ import annotations

import sys

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import Environment
from service.errors import Conflict, NotFound
from service.settings import Settings

DEFAULT_ENVIRONMENT = "default"


def get_environment(session: Session, *, name: str) -> Environment:
    """The environment called name, or 404."""
    env = session.scalar(select(Environment).where(Environment.name == name))
    if env is None:
        raise NotFound(f"environment: unknown environment {name!r}", field="environment")
    return env


def ensure_default_environment(session: Session, *, settings: Settings) -> Environment:
    """The default environment (the service's own Python unless PARITY_JOB_PYTHON says otherwise)."""
    query = select(Environment).where(Environment.name == DEFAULT_ENVIRONMENT)
    env = session.scalar(query)
    if env is None:
        # Two first requests race to create it: ON CONFLICT makes the loser wait for the winner's
        # commit and then read its row (a plain INSERT was a UniqueViolation, a 500, for the loser).
        session.execute(
            insert(Environment).values(
                name=DEFAULT_ENVIRONMENT, python=settings.job_python or sys.executable,
                description="The Python the service itself runs with", packages={},
            ).on_conflict_do_nothing(index_elements=["name"])
        )
        env = session.scalar(query.execution_options(populate_existing=True))
        assert env is not None
    return env


def create_environment(session: Session, *, name: str, python: str, description: str = "") -> Environment:
    """Register a new environment; names are unique."""
    if session.scalar(select(Environment.id).where(Environment.name == name)) is not None:
        raise Conflict(f"name: environment {name!r} already exists", field="name")
    env = Environment(name=name, python=python, description=description, packages={})
    session.add(env)
    session.flush()
    return env


def list_environments(session: Session) -> list[Environment]:
    """All environments, by name."""
    return list(session.scalars(select(Environment).order_by(Environment.name)))
