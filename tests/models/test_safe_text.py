"""Every text column takes what a job or a build wrote, NUL included: Postgres refuses NUL in text, and a
refused UPDATE of a run or an environment fails the scheduler's pass on every try (models/jsonsafe.py)."""

from __future__ import annotations

from sqlalchemy import Text
from sqlalchemy.orm import Session

from models import Base, Environment, Run
from models.jsonsafe import SafeJSONB, SafeText

HOSTILE = "Traceback: RuntimeError: boom\x00 after a NUL"


def test_no_column_is_plain_text() -> None:
    plain = [f"{t.name}.{c.name}" for t in Base.metadata.tables.values() for c in t.columns
             if type(c.type) is Text]
    assert plain == [], "a Text column that a NUL would make unstorable: use models.jsonsafe.SafeText"


def test_what_a_build_writes_into_an_environment_is_storable() -> None:
    columns = Environment.__table__.columns
    assert isinstance(columns["packages"].type, SafeJSONB) and isinstance(columns["freeze"].type, SafeJSONB)
    assert isinstance(columns["error_message"].type, SafeText)


def test_a_nul_in_a_jobs_message_is_stored_as_a_replacement_character(db_session: Session) -> None:
    env = Environment(name="nul-env", python="/usr/bin/python3", packages={"x": "a\x00b"}, freeze=["p==1\x00"],
                      error_message=HOSTILE, state="failed")
    db_session.add(env)
    db_session.flush()
    run = Run(config="moe-fp32-router", spec={"config": "moe-fp32-router"}, environment_id=env.id, labels={},
              check_key="0" * 16, check_name="nul", track="t", error_message=HOSTILE)
    db_session.add(run)
    db_session.flush()
    db_session.expire_all()
    stored_env, stored_run = db_session.get(Environment, env.id), db_session.get(Run, run.id)
    assert stored_env is not None and stored_run is not None
    assert stored_run.error_message == stored_env.error_message == HOSTILE.replace("\x00", "\ufffd")
    assert stored_env.packages == {"x": "a\ufffdb"} and stored_env.freeze == ["p==1\ufffd"]
