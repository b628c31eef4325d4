"""Multi-node: the run page and the API show the node of each rank (fast; golden documents, no cluster)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from models import Environment, Phase
from tests.plugins.seed import golden_run


def test_run_page_and_api_show_each_ranks_node(client, db_session: Session) -> None:
    env = Environment(name="golden", python="/usr/bin/python3", packages={})
    db_session.add(env)
    db_session.flush()
    old = golden_run(db_session, env, "good")  # documents from before nodes were recorded
    run = golden_run(db_session, env, "good")
    for phase in db_session.scalars(select(Phase).where(Phase.run_id == run.id)):
        phase.info = {**phase.info, "node": "pnode1", "rank_nodes": ["pnode1", "pnode2"]}
    db_session.flush()

    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert '<span class="rank-node" data-rank="0">rank 0: pnode1</span>' in page.text
    assert '<span class="rank-node" data-rank="1">rank 1: pnode2</span>' in page.text
    api = client.get(f"/api/v1/runs/{run.id}").json()
    assert {p["name"]: p["rank_nodes"] for p in api["phases"]} == {
        "train_and_save": ["pnode1", "pnode2"], "resume": ["pnode1", "pnode2"],
    }

    before = client.get(f"/runs/{old.id}")
    assert before.status_code == 200 and 'class="rank-node"' not in before.text
    assert all(p["rank_nodes"] == [] for p in client.get(f"/api/v1/runs/{old.id}").json()["phases"])
