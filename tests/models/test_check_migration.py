"""Migration 0006 gives runs that existed before it their check key and track, as the service computes them."""

from __future__ import annotations

import json

from sqlalchemy import text

from service.core.checks import check_key, check_name
from service.core.db import downgrade, upgrade
from tests.plugins.scratch import scratch_database

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10, "sharding": "dp_reshardable",
        "seed": 1234, "tolerance": "exact", "workarounds": ["realign-param-index"]}


def test_existing_runs_get_their_check_key_and_track() -> None:
    with scratch_database() as (url, engine):
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
