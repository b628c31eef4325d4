"""The run and triage pages over runs ingested from the golden documents of a real DP 2 run (fast; no browser)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from models import Environment
from tests.dashboard.seed import golden_run


def _env(session: Session) -> Environment:
    env = Environment(name="golden", python="/usr/bin/python3", packages={})
    session.add(env)
    session.flush()
    return env


def test_known_bad_run_page_and_triage_show_bug_a(client, db_session: Session) -> None:
    run = golden_run(db_session, _env(db_session), "bad")
    assert run.verdict == "fail" and run.summary["errors"][0]["stage"] == "save"
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert "decoder.layers.0.mlp.router.weight" in page.text  # a misaligned param, from the real index-map probe
    triage = client.get(f"/runs/{run.id}/triage")
    assert triage.status_code == 200
    assert "Optimizer index map points at other params&#39; shards" in triage.text
    assert "<strong>save</strong>: <code>AssertionError</code>: (torch.Size([512]), 0, 131072)" in triage.text
    assert "misaligned_total" in triage.text  # the evidence block, from the real probe
    # a crashed save is not a clean comparison: the resume never ran, and the bare assertion is explained
    assert 'id="resume-never-ran"' in triage.text and "wrong parameter" in triage.text
    assert "the resume never ran: nothing was compared" in page.text and 'id="no-delta"' in page.text
    assert "none (bit-exact)" not in page.text


def test_known_good_run_page_shows_a_bit_identical_resume(client, db_session: Session) -> None:
    run = golden_run(db_session, _env(db_session), "good")
    assert (run.verdict, run.max_abs_loss_delta, run.first_divergent_step) == ("pass", 0.0, None)
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200 and "realign-param-index" in page.text
    assert "nothing to triage" in client.get(f"/runs/{run.id}/triage").text
