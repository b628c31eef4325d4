"""Security tests: each shows an attack from the issue failing against the defence that stops it."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.core.tokens import create_token


@pytest.fixture
def tokens(committed_db: str):
    """Committed tokens: tokens(name, *scopes, tracks=("*",)) -> the bearer secret."""
    engine = create_engine(committed_db)

    def _make(name: str, *scopes: str, tracks: tuple[str, ...] = ("*",)) -> str:
        with Session(engine) as session:
            secret = create_token(session, name=name, scopes=list(scopes), tracks=list(tracks))
            session.commit()
        return secret

    yield _make
    engine.dispose()
