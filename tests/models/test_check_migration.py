"""Migration 0006 gives runs that existed before it their check key and track, as the service computes them."""

from __future__ import annotations

import json
import uuid

import psycopg
from sqlalchemy import create_engine, make_url, text

from service.checks import check_key, check_name
from service.migrate import downgrade, upgrade
from tests.conftest import SERVER_URL, _admin_conninfo

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10, "sharding": "dp_reshardable",
        "seed": 1234, "tolerance": "exact", "workarounds": ["realign-param-index"]}


def test_existing_runs_get_their_check_key_and_track() -> None:
    name = f"parity_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        upgrade(url)
        downgrade(url, "0006-1")
        with engine.begin() as conn:
            env_id = conn.execute(text(
                "INSERT INTO environments (name, python, description, packages, created_at) "
                "VALUES ('mcore-main', 'python', '', '{}', now()) RETURNING id")).scalar_one()
            insert = text(
                "INSERT INTO runs (config, spec, environment_id, labels, state, state_version, updated_at, "
                "cancel_requested, signatures, summary, regression, created_at) VALUES (:config, :spec, :env, "
                ":labels, 'passed', 0, now(), false, '[]', '{}', false, now())")
            conn.execute(insert, {"config": "moe-fp32-router", "spec": json.dumps(SPEC), "env": env_id,
                                  "labels": json.dumps({"branch": "pr-9"})})
            conn.execute(insert, {"config": "moe-fp32-router", "spec": json.dumps(SPEC), "env": env_id,
                                  "labels": "{}"})
        upgrade(url)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT check_key, check_name, track FROM runs ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [(check_key(SPEC), check_name(SPEC), "pr-9"),
                                            (check_key(SPEC), check_name(SPEC), "mcore-main")]
    finally:
        engine.dispose()
        with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
