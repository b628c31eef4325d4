"""`parity notify list` against a real server: channels with their outbox counts, secrets never shown."""

from __future__ import annotations

import argparse

import httpx
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.cli.client.notify import list_channels
from service.core.tokens import create_token


def test_notify_list_prints_channels(locked_server: str, committed_db: str, capsys) -> None:
    engine = create_engine(committed_db)
    with Session(engine) as session:
        admin = create_token(session, name="ops", scopes=["admin"])
        session.commit()
    engine.dispose()
    headers = {"Authorization": f"Bearer {admin}"}
    made = httpx.post(f"{locked_server}/api/v1/notifications/channels", headers=headers, json={
        "name": "pager", "kind": "webhook", "url": "https://93.184.215.14/p", "secret": "x" * 20,
        "events": ["regression.opened"]})
    assert made.status_code == 201, made.text
    args = argparse.Namespace(url=locked_server, token=admin)
    assert list_channels(args) == 0
    out = capsys.readouterr().out
    assert "pager" in out and "https://93.184.215.14/p" in out and "[regression.opened]" in out
    assert "signed" in out and "x" * 20 not in out
    assert list_channels(argparse.Namespace(url=locked_server, token="prt_nope")) == 2
