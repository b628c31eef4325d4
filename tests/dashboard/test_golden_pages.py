"""The run and triage pages over runs ingested from the golden documents of a real DP 2 run (fast; no browser)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from models import Environment
from tests.plugins.seed import golden_run


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


def test_a_probe_that_could_not_run_shows_as_an_advisory_on_the_run_page(client, db_session: Session) -> None:
    from unittest import mock

    from tests.golden import documents

    reason = "not applicable on this build: AttributeError: '_ParamAndGradBucket' has no attribute 'param_to_index'"
    real = documents("good")

    def without_buckets(case: str) -> dict:
        docs = real if case == "good" else documents(case)
        for doc in docs.values():  # a build whose buckets the probe cannot read (0.12.x lays them out otherwise)
            doc["probes"]["buckets"] = {"applicable": False, "unaligned_total": 0, "per_rank": [], "reason": reason}
        return docs

    with mock.patch("tests.golden.documents", without_buckets):
        run = golden_run(db_session, _env(db_session), "good")
    assert run.verdict == "pass" and run.summary["advisories"] == ["probe-not-applicable"]
    page = client.get(f"/runs/{run.id}")
    assert 'id="advisories"' in page.text and "train_and_save.buckets: not applicable on this build" in page.text
    assert "final state bit-exact" in page.text


def test_copy_as_issue_carries_the_smallest_reproduction_parity_shrink_recorded(client, db_session: Session) -> None:
    import html
    import re

    from jobs.launch.shrink import run_local_command
    from jobs.spec import RunSpec

    run = golden_run(db_session, _env(db_session), "bad")
    page = client.get(f"/runs/{run.id}/triage").text
    assert "Smallest reproduction" not in page  # nothing shrunk yet
    smallest = RunSpec.from_dict({**run.spec, "shape": {"num_layers": 1}, "steps": 4, "save_step": 1})
    run.summary = {**run.summary, "shrink": {"strictly_smaller": True, "runs": 3, "smallest": smallest.to_dict(),
                                             "command": run_local_command(smallest)}}
    db_session.flush()
    page = client.get(f"/runs/{run.id}/triage").text
    issue = html.unescape(re.search(r'<textarea id="issue-md"[^>]*>(.*?)</textarea>', page, re.S).group(1))  # type: ignore[union-attr]
    assert "Smallest reproduction (same verdict and signatures, 3 trial runs):" in issue
    assert "parity run-local --config moe-fp32-router --dp 2 --steps 4 --save-step 1 --shape num_layers=1" in issue
