"""Tracks (fast): the scheduler runs a due track's suite on its source's latest commit, labelled track and
commit; a PR failing where main fails too is not the PR's regression; a pass -> fail on the track is
bisected over the commits between and the first bad one is named on the regression and in the alert."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Environment, NotificationChannel, OutboxMessage, Regression, Run, SuiteRun, Track
from models.base import utcnow
from service.bisects import search as bisects
from service.cli.client.bisect import report
from service.cli.client.ci_report import suite_junit_xml
from service.cli.client.track import track_line
from service.core.run_state import RunState
from service.core.settings import get_settings
from service.environments import sources
from service.runs.evaluation import judge
from service.runs.lifecycle import transition
from service.suites.definitions import SuiteCheck, apply_suite
from service.suites.runs import create_suite_run, suite_run_view
from service.tracks import schedule
from tests.plugins.git_repo import PYPROJECT, Repo

SPEC = {"config": "dense-bf16", "dp": 1, "steps": 6, "save_step": 3, "workarounds": ["restore-adam-step"]}
BASE = "http://testserver"


def _setup(session: Session, tmp_path: Path, commits: int = 2) -> tuple[Repo, list[str]]:
    repo = Repo(tmp_path / "megatron-lm")
    shas = [repo.commit("Initial import", {"pyproject.toml": PYPROJECT})]
    shas += [repo.commit(f"Change {i}") for i in range(1, commits)]
    sources.register_source(session, name="mlm", location=str(repo.path), ref="main")
    apply_suite(session, name="one", checks=[SuiteCheck.model_validate({"name": "dense", "spec": SPEC})])
    return repo, shas


def _finish(session: Session, run: Run, verdict: str) -> None:
    for state in (RunState.TRAIN_SUBMITTED, RunState.EVALUATING,
                  RunState.PASSED if verdict == "pass" else RunState.FAILED):
        transition(session, run, state, "test")
    run.verdict = verdict
    judge(session, run)  # as the evaluator does: history flags, then the regression object
    session.flush()


def _suite_run(session: Session, suite_run_id: str) -> list[Run]:
    suite_run = session.get(SuiteRun, suite_run_id)
    assert suite_run is not None
    return [session.get(Run, r["run_id"]) for r in suite_run.runs]  # type: ignore[misc]


def _track_runs(session: Session, verdict: str) -> Run:
    """Let the scheduler run the due track and finish its one run with verdict."""
    assert schedule.run_due(session, settings=get_settings()) == 1
    track = session.scalar(select(Track).where(Track.name == "main"))
    assert track is not None and track.last_suite_run_id is not None
    (run,) = _suite_run(session, track.last_suite_run_id)
    _finish(session, run, verdict)
    return run


@pytest.mark.engine
def test_a_due_track_runs_its_suite_on_the_latest_commit_labelled_track_and_commit(
    client: TestClient, make_token, db_session: Session, tmp_path: Path,
) -> None:
    repo, shas = _setup(db_session, tmp_path)
    admin = make_token("admin", "submit")
    resp = client.post("/api/v1/tracks", json={"name": "main", "source": "mlm", "suite": "one", "every": "24h"},
                       headers=admin)
    assert resp.status_code == 201, resp.text
    assert client.post("/api/v1/tracks", json={"name": "t2", "source": "mlm", "suite": "one", "every": "5s"},
                       headers=admin).json()["field"] == "every"
    settings = get_settings()
    assert schedule.run_due(db_session, settings=settings) == 1
    track = schedule.get_track(db_session, "main")
    (run,) = _suite_run(db_session, track.last_suite_run_id or "")
    assert run.labels["track"] == "main" and run.labels["commit"] == shas[-1] and run.track == "main"
    assert track.last_commit == shas[-1] and track.next_run_at - track.last_run_at == timedelta(hours=24)  # type: ignore[operator]
    assert schedule.run_due(db_session, settings=settings) == 0  # not due again for a day

    new = repo.commit("A new commit on main")
    # its runs write track main: a token granted only the PR tracks may not make it run (nor bisect it)
    pr_token = make_token("submit", name="ci-prs", tracks=("pr-*",))
    refused = client.post("/api/v1/tracks/main/run", headers=pr_token)
    assert refused.status_code == 403 and "main" in refused.json()["detail"]
    assert client.post("/api/v1/tracks/main/bisect", json={"check": run.check_key}, headers=pr_token).status_code == 403
    assert schedule.run_due(db_session, settings=settings) == 0
    owner = make_token("submit", name="main-owner", tracks=("main",))
    assert client.post("/api/v1/tracks/main/run", headers=owner).status_code == 202  # parity track run main
    assert schedule.run_due(db_session, settings=settings) == 1
    track = schedule.get_track(db_session, "main")
    (second,) = _suite_run(db_session, track.last_suite_run_id or "")
    assert second.labels["commit"] == new and second.environment_id != run.environment_id
    listed = client.get("/api/v1/tracks").json()
    assert [t["name"] for t in listed] == ["main"] and listed[0]["last_commit"] == new
    line = track_line(listed[0])  # `parity track list`
    assert line.startswith("main") and "suite one" in line and "every 1d" in line and new[:12] in line

    # a source git cannot read: the track says why, and tries again at its next turn
    repo.git("branch", "-m", "main", "trunk")
    client.post("/api/v1/tracks/main/run", headers=owner)
    assert schedule.run_due(db_session, settings=settings) == 0
    track = schedule.get_track(db_session, "main")
    assert track.last_error and "main" in track.last_error and track.next_run_at > utcnow()


@pytest.mark.engine
def test_a_pr_failing_where_main_fails_too_is_not_the_prs_regression(
    db_session: Session, tmp_path: Path,
) -> None:
    _, shas = _setup(db_session, tmp_path, commits=3)
    schedule.add_track(db_session, name="main", source="mlm", suite="one", every="24h", auto_bisect=False,
                       created_by="admin")
    settings = get_settings()
    source = sources.get_source(db_session, "mlm")
    pr_env = sources.commit_environment(db_session, source=source, commit=sources.resolve(source, settings, shas[0]),
                                        settings=settings)

    def pr_run(branch: str, verdict: str) -> dict:
        suite_run, _ = create_suite_run(db_session, suite_name="one", version=None, environment=pr_env.name,
                                        labels={"branch": branch, "base_branch": "main"}, requester="ci",
                                        settings=settings)
        (run,) = _suite_run(db_session, suite_run.id)
        _finish(db_session, run, verdict)
        return suite_run_view(db_session, suite_run_id=suite_run.id, base=BASE)

    _track_runs(db_session, "pass")  # main passes at its head
    failing = pr_run("pr-1", "fail")  # a check that passes on main and fails on the PR is the PR's
    assert failing["verdict"] == "fail" and failing["checks"][0]["run"]["regression"] is True
    assert failing["checks"][0]["fails_on_base"] is None

    # main breaks: its next run fails (at a later commit)
    track = schedule.request_run(db_session, "main")
    broken = _track_runs(db_session, "fail")
    assert broken.regression is True
    shared = pr_run("pr-2", "fail")
    check = shared["checks"][0]
    assert check["outcome"] == "fails-on-base" and check["run"]["regression"] is False
    assert check["fails_on_base"] == f"fails on main too (since {track.last_commit[:12]})"  # type: ignore[index]
    assert shared["verdict"] == "pass" and shared["counts"]["fails-on-base"] == 1
    # one answer: the run alone (`parity submit --config`) exits as the suite does, never 1 where the suite says 0
    assert check["run"]["outcome"] == {"result": "fails-on-base", "exit_code": 0, "exit_code_strict": 0}
    assert shared["outcome"] == {"result": "pass", "exit_code": 0, "exit_code_strict": 0}
    assert failing["checks"][0]["run"]["outcome"]["exit_code"] == failing["outcome"]["exit_code"] == 1
    assert b'skipped message="fails on main too' in suite_junit_xml(shared, timed_out=False)
    # a branch whose own last run passed, failing now where main fails: not its regression either
    again = pr_run("pr-1", "pass")
    assert again["verdict"] == "pass"
    later = pr_run("pr-1", "fail")
    assert later["checks"][0]["run"]["regression"] is False and later["checks"][0]["outcome"] == "fails-on-base"
    assert db_session.scalar(select(Regression).where(Regression.track == "pr-1", Regression.state == "open")) is None


@pytest.mark.engine
def test_a_pass_to_fail_on_the_track_is_bisected_to_the_first_bad_commit(
    client: TestClient, db_session: Session, tmp_path: Path,
) -> None:
    repo = Repo(tmp_path / "megatron-lm")
    shas = [repo.commit("Initial import", {"pyproject.toml": PYPROJECT})]
    sources.register_source(db_session, name="mlm", location=str(repo.path), ref="main")
    apply_suite(db_session, name="one", checks=[SuiteCheck.model_validate({"name": "dense", "spec": SPEC})])
    db_session.add(NotificationChannel(name="hook", kind="webhook", url="https://alerts.example.com/x",
                                       events=["regression.bisected"], enabled=True))
    schedule.add_track(db_session, name="main", source="mlm", suite="one", every="24h", auto_bisect=True,
                       created_by="admin")
    settings = get_settings()
    good = _track_runs(db_session, "pass")
    shas += [repo.commit(s) for s in ("Refactor the optimizer", "Restore the scheduler one step short",
                                      "Docs", "More docs", "Tests")]
    schedule.request_run(db_session, "main")
    bad = _track_runs(db_session, "fail")
    assert good.labels["commit"] == shas[0] and bad.labels["commit"] == shas[-1] and bad.regression

    # the scheduler's step: the new regression starts a bisect over the 4 commits between
    assert schedule.bisect_regressions(db_session, settings=settings) == 1
    reg = db_session.scalar(select(Regression).where(Regression.track == "main"))
    assert reg is not None and reg.bisect_id and reg.first_bad_commit is None
    truth = {sha: ("fail" if i >= 2 else "pass") for i, sha in enumerate(shas)}
    built = set()
    for _ in range(6):
        row = bisects.advance(db_session, reg.bisect_id, settings=settings)
        if row.state != "running":
            break
        (step,) = db_session.scalars(select(Run).where(Run.labels.contains({"bisect": row.id}),
                                                       Run.finished_at.is_(None))).all()
        env_commit = next(c["sha"] for c in row.commits or []
                          if sources.find_commit_environment(db_session, c["sha"], settings) is not None
                          and sources.find_commit_environment(db_session, c["sha"], settings).id  # type: ignore[union-attr]
                          == step.environment_id)
        built.add(env_commit)
        _finish(db_session, step, truth[env_commit])
    assert row.state == "found", row.error_message
    # only the commits a step needed were built (the endpoints' builds came from the track)
    assert built == {shas[1], shas[2]}
    doc = bisects.describe(db_session, row, BASE)
    assert doc["first_bad_commit"]["sha"] == shas[2]
    assert doc["first_bad_commit"]["subject"] == "Restore the scheduler one step short"
    assert doc["last_good_commit"]["sha"] == shas[1]
    assert "first bad commit: " + shas[2] + " Restore the scheduler one step short" in report(doc)

    assert schedule.bisect_regressions(db_session, settings=settings) == 1
    db_session.refresh(reg)
    assert reg.first_bad_commit == shas[2] and reg.first_bad_subject == "Restore the scheduler one step short"
    (alert,) = db_session.scalars(select(OutboxMessage).where(OutboxMessage.event == "regression.bisected"))
    assert "Restore the scheduler one step short" in alert.payload["summary"]
    assert alert.payload["regression"]["first_bad_commit"] == shas[2]
    page = client.get(f"/regressions/{reg.id}")
    assert page.status_code == 200 and "Restore the scheduler one step short" in page.text
    assert schedule.bisect_regressions(db_session, settings=settings) == 0  # named once

    # a PR failing the check now: fails on main too, since the commit the bisect named
    suite_run, _ = create_suite_run(db_session, suite_name="one", version=None,
                                    environment=db_session.get(Environment, bad.environment_id).name,  # type: ignore[union-attr]
                                    labels={"branch": "pr-7", "base_branch": "main"}, requester="ci", settings=settings)
    (pr,) = _suite_run(db_session, suite_run.id)
    _finish(db_session, pr, "fail")
    check = suite_run_view(db_session, suite_run_id=suite_run.id, base=BASE)["checks"][0]
    assert check["fails_on_base"] == f"fails on main too (since {shas[2][:12]})"

    overview = client.get("/").text  # main's row: its latest verdict, and the commit that changed it
    row = overview.split('id="tracks"', 1)[1].split("</table>", 1)[0]
    # its latest commit, and the one that broke it (the bisect's answer, not the first failing track run)
    assert shas[-1][:12] in row and shas[2][:12] in row and "(first bad, bisected)" in row


@pytest.mark.engine
def test_a_track_whose_suite_holds_a_cuda_check_the_executor_cannot_give_says_so_and_queues_nothing(
    db_session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler's own queueing is held to the GPUs as a client's is (never to the 429 caps): a track's suite
    with a cuda check on a CPU-only installation queues nothing, and the track's last error names the check."""
    monkeypatch.setenv("PARITY_GPUS", "0")
    get_settings.cache_clear()
    try:
        _setup(db_session, tmp_path)
        apply_suite(db_session, name="one", checks=[
            SuiteCheck.model_validate({"name": "dense", "spec": SPEC}),
            SuiteCheck.model_validate({"name": "dense-cuda", "spec": {**SPEC, "device": "cuda"}})])
        schedule.add_track(db_session, name="main", source="mlm", suite="one", every="24h", auto_bisect=False,
                           created_by="admin")
        queued = db_session.scalar(select(func.count()).select_from(Run))
        assert schedule.run_due(db_session, settings=get_settings()) == 0
        track = schedule.get_track(db_session, "main")
        error = track.last_error or ""
        assert "checks[1] (dense-cuda)" in error and "PARITY_GPUS has 0" in error, error
        assert db_session.scalar(select(func.count()).select_from(Run)) == queued
    finally:
        get_settings.cache_clear()
