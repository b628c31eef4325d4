"""Submitter, reconciler and evaluator at the database level, with a fake launcher returning golden documents.

The real launcher (submitit on Slurm and local processes) is tested in test_scheduler_slurm.py and
test_end_to_end.py; here each scheduler step runs against the real Postgres, one transaction owner.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.rank.entry import run_rank_phase
from jobs.run_folder import RunFolder
from jobs.spec import RunSpec
from models import Environment, Phase, ProbeFinding, Run, StepMetric
from service.core.phase_state import PhaseState
from service.core.settings import Settings, get_settings
from service.executors import launcher
from service.executors.launcher import JobStatus, PhaseJob
from service.runs.records import create_run
from service.scheduler.evaluation import evaluate_pending
from service.scheduler.reconciler import reconcile
from service.scheduler.submitter import claim_queued, launch, local_slots, next_pending
from tests.golden import documents, expected


@dataclass
class FakeLauncher:
    """Stands in for submitit: records submissions, reports a state, and leaves a chosen document per phase."""

    docs: dict[str, Any]
    state: JobStatus = field(default_factory=lambda: JobStatus(kind="done", raw="COMPLETED"))
    submitted: list[dict[str, Any]] = field(default_factory=list)
    already_submitted: str | None = None
    refuse: str | None = None
    raised: str | None = None
    cancelled: list[str] = field(default_factory=list)

    def submit_phase(self, request: launcher.JobRequest, _settings: Any) -> PhaseJob:
        if self.refuse:
            raise RuntimeError(self.refuse)
        kw = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}  # what the executor is asked
        self.submitted.append(kw)
        return PhaseJob(executor=kw["executor"], folder=str(kw["folder"]), job_id=f"job-{len(self.submitted)}",
                        tasks=kw["tasks"])

    def cancel(self, job: PhaseJob) -> None:
        self.cancelled.append(job.job_id)

    def poll(self, jobs: list[PhaseJob]) -> dict[PhaseJob, JobStatus]:
        """A job that ended leaves its ranks' documents in their attempt folders, as the real ranks do."""
        if self.state.kind in ("done", "failed") and not self.raised:
            for kw in self.submitted:
                self._write_documents(kw["args"], kw["tasks"])
        return {j: self.state for j in jobs}

    def _write_documents(self, args: tuple[Any, ...], tasks: int) -> None:
        root, phases, attempts = Path(args[1]), args[2], args[4]
        if isinstance(phases, str):  # one phase per job: (spec, root, phase, port, attempt, checkpoint_attempt)
            phases, attempts = (phases,), {phases: attempts}
        for phase in phases:
            if phase not in self.docs:
                continue
            folder = RunFolder(root).attempt(phase, attempts.get(phase, 1))
            folder.folder.mkdir(parents=True, exist_ok=True)
            for rank in range(tasks):
                folder.result(rank).write_text(json.dumps({**self.docs[phase], "rank": rank}))

    def failure_text(self, job: PhaseJob) -> str:
        return self.raised or "no output"


@pytest.fixture
def settings(settings_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings on the test database, the local executor (no Slurm probe) and no retry backoff."""
    monkeypatch.setenv("PARITY_EXECUTOR", "local")
    monkeypatch.setenv("PARITY_RETRY_BACKOFF_SECONDS", "0")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def _fake(monkeypatch: pytest.MonkeyPatch, docs: dict[str, Any], **kw: Any) -> FakeLauncher:
    fake = FakeLauncher(docs=docs, **kw)
    monkeypatch.setattr(launcher, "submit_phase", fake.submit_phase)
    monkeypatch.setattr(launcher, "find_submitted", lambda folder: fake.already_submitted)
    monkeypatch.setattr(launcher, "poll", fake.poll)
    monkeypatch.setattr(launcher, "failure_text", fake.failure_text)
    monkeypatch.setattr(launcher, "log_paths", lambda job: [])
    monkeypatch.setattr(launcher, "cancel", fake.cancel)
    return fake


def _queued(session: Session, case: str, isolation: str = "job") -> Run:
    env = Environment(name=f"env-{case}", python="/usr/bin/python3", packages={})
    session.add(env)
    session.flush()
    # isolation "job" walks the two-job path (one submission per phase); "process" forks the resume
    spec = RunSpec.from_dict({**expected(case)["spec"], "isolation": isolation})
    run, _ = create_run(session, spec=spec, environment=env, labels={}, requester="test")
    return run


def _phases(session: Session, run: Run) -> list[Phase]:
    return list(session.scalars(select(Phase).where(Phase.run_id == run.id).order_by(Phase.id)))


def _launch_one(session: Session, settings: Settings) -> bool:
    phase = next_pending(session)
    if phase is not None:
        launch(session, phase, settings=settings, executor="local")
    return phase is not None


def _evaluate_one(session: Session, settings: Settings) -> bool:
    return evaluate_pending(session, settings=settings, limit=1) == 1


def _drive(session: Session, settings: Settings) -> None:
    """What one scheduler tick does, in one transaction (the test's)."""
    claim_queued(session, settings=settings, executor="local")
    while _launch_one(session, settings):
        pass
    reconcile(session, settings=settings, executor="local")


def test_known_good_run_goes_through_both_phases_to_pass(db_session: Session, settings: Settings,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    docs = documents("good")
    fake = _fake(monkeypatch, dict(docs))
    run = _queued(db_session, "good", isolation="job")
    _drive(db_session, settings)  # claim, submit train_and_save, ingest it, queue resume
    assert run.state == "resume_submitted"
    first = _phases(db_session, run)[0]
    assert (first.name, first.state, first.job_id) == ("train_and_save", "succeeded", "job-1")
    assert first.info == docs["train_and_save"] and first.save_s == docs["train_and_save"]["info"]["save_seconds"]
    assert fake.submitted[0]["function"] is run_rank_phase
    assert fake.submitted[0]["args"] == (run.spec, str(settings.resolved_run_folder / f"run-{run.id}"),
                                         "train_and_save", None, 1, 1)
    _drive(db_session, settings)  # submit resume, ingest it
    assert run.state == "evaluating" and [p.state for p in _phases(db_session, run)] == ["succeeded"] * 2
    assert [s["args"][2] for s in fake.submitted] == ["train_and_save", "resume"]  # one job per phase
    assert _evaluate_one(db_session, settings)
    assert (run.state, run.verdict, run.signatures) == ("passed", "pass", [])
    assert run.summary["schema_version"] == 2 and run.summary["worked_around"] == expected("good")["worked_around"]
    assert run.summary["packages"]["megatron_core"] == "0.16.1" and run.summary["isolation"] == "job"
    assert db_session.scalar(select(func.count()).where(StepMetric.run_id == run.id)) == 6
    assert (db_session.scalar(select(func.count()).where(ProbeFinding.run_id == run.id)) or 0) > 0


def test_known_good_run_with_process_isolation_resumes_in_the_same_job(
    db_session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake(monkeypatch, dict(documents("good")))
    run = _queued(db_session, "good", isolation="process")
    _drive(db_session, settings)  # the attempt's job ran train_and_save; its resume child is recorded as running
    _drive(db_session, settings)
    assert len(fake.submitted) == 1 and fake.submitted[0]["args"][2] == ("train_and_save", "resume")
    assert [(p.name, p.state, p.job_id) for p in _phases(db_session, run)] == [
        ("train_and_save", "succeeded", "job-1"), ("resume", "succeeded", "job-1")]
    assert run.state == "evaluating" and _evaluate_one(db_session, settings) and run.verdict == "pass"
    # the forked resume wrote into its own attempt folder, loading the checkpoint its job saved
    assert fake.submitted[0]["args"][4:] == ({"train_and_save": 1, "resume": 1}, 1)
    saved, resumed = _phases(db_session, run)
    assert resumed.job_folder == saved.job_folder and resumed.folder != saved.folder


def test_known_bad_crash_is_evaluated_without_a_resume(db_session: Session, settings: Settings,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, dict(documents("bad")), state=JobStatus(kind="failed", raw="FAILED"))
    run = _queued(db_session, "bad")
    _drive(db_session, settings)
    (phase,) = _phases(db_session, run)
    assert phase.state == "failed" and (phase.exit_reason or "").startswith("save: AssertionError")
    assert run.state == "evaluating" and _evaluate_one(db_session, settings)
    assert (run.state, run.verdict) == ("failed", "fail")
    assert run.signatures[:2] == ["checkpoint-save-crash", "optimizer-index-misalignment"]
    assert run.error_message and run.error_message.startswith("AssertionError")


def test_an_invalid_document_is_an_error_naming_the_field(db_session: Session, settings: Settings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    docs: dict[str, Any] = dict(documents("good"))
    broken = dict(docs["train_and_save"])
    broken["steps"] = [{k if k != "loss" else "loss_value": v for k, v in s.items()} for s in broken["steps"]]
    docs["train_and_save"] = broken
    _fake(monkeypatch, docs)
    run = _queued(db_session, "good")
    _drive(db_session, settings)
    (phase,) = _phases(db_session, run)
    assert phase.state == "failed" and "steps.0.loss" in (phase.exit_reason or "")
    assert phase.info["error"]["type"] == "InvalidDocument" and phase.info["info"]["rejected_document"] == broken
    assert _evaluate_one(db_session, settings)
    assert (run.state, run.verdict) == ("error", "error")
    assert "steps.0.loss" in (run.error_message or "")


def test_a_job_that_raised_is_an_error_not_retried(db_session: Session, settings: Settings,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {}, state=JobStatus(kind="failed", raw="FAILED"), raised="rank 0: RuntimeError: boom")
    run = _queued(db_session, "good")
    _drive(db_session, settings)
    assert [p.state for p in _phases(db_session, run)] == ["failed"]
    assert _evaluate_one(db_session, settings) and run.verdict == "error"
    assert "boom" in (run.error_message or "")


def test_an_infra_failure_is_retried_then_an_error(db_session: Session, settings: Settings,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake(monkeypatch, {}, state=JobStatus(kind="infra", raw="NODE_FAIL"))
    run = _queued(db_session, "good")
    for _ in range(settings.max_infra_retries + 1):
        _drive(db_session, settings)
    phases = _phases(db_session, run)
    assert [p.attempt for p in phases] == list(range(1, settings.max_infra_retries + 2))
    assert all(p.state == "infra_failed" for p in phases) and len(fake.submitted) == len(phases)
    assert len({p.folder for p in phases}) == len(phases)  # each attempt has its own submitit folder
    assert fake.cancelled == [p.job_id for p in phases]  # each old job stopped before its retry
    assert run.state == "error" and run.verdict is None and "NODE_FAIL" in (run.error_message or "")


def test_a_phase_already_submitted_is_adopted_not_resubmitted(db_session: Session, settings: Settings,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake(monkeypatch, {}, state=JobStatus(kind="active", raw="PENDING"), already_submitted="4242")
    run = _queued(db_session, "good")
    _drive(db_session, settings)
    (phase,) = _phases(db_session, run)
    assert fake.submitted == [] and (phase.state, phase.job_id) == ("submitted", "4242")


def test_a_refused_submission_is_an_infra_failure_with_a_retry(db_session: Session, settings: Settings,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, {}, refuse="sbatch: error: invalid partition specified: nope")
    run = _queued(db_session, "good")
    claim_queued(db_session, settings=settings, executor="local")
    assert _launch_one(db_session, settings)
    first, retry = _phases(db_session, run)
    assert first.state == "infra_failed" and "invalid partition" in (first.exit_reason or "")
    assert (retry.state, retry.attempt) == ("pending", 2) and run.state == "train_submitted"


def test_local_executor_starts_no_more_phase_jobs_than_its_slots(
    db_session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a sweep queues many runs at once: on the local executor they must take turns, not all start together
    fake = _fake(monkeypatch, dict(documents("good")))
    limited = settings.model_copy(update={"local_max_running": 1})
    first = _queued(db_session, "good", isolation="job")
    _queued_again(db_session, first)
    claim_queued(db_session, settings=limited, executor="local")
    assert local_slots(db_session, limited) == 1
    assert _launch_one(db_session, limited)
    assert len(fake.submitted) == 1 and local_slots(db_session, limited) == 0
    # the first job ends (its resume phase is pending, not running): its slot frees for the second run
    reconcile(db_session, settings=limited, executor="local")
    assert local_slots(db_session, limited) == 1
    assert local_slots(db_session, settings.model_copy(update={"local_max_running": 3})) == 3


def _queued_again(session: Session, run: Run) -> Run:
    env = session.get(Environment, run.environment_id)
    assert env is not None
    again, _ = create_run(session, spec=RunSpec.from_dict(run.spec), environment=env, labels={"n": "2"},
                          requester="test")
    return again


def _two_runs(session: Session, env_name: str, first_labels: dict[str, str]) -> tuple[Run, Run]:
    """Two queued runs of the golden check on a new environment: the first with first_labels, then a user's."""
    env = Environment(name=env_name, python="/usr/bin/python3", packages={})
    session.add(env)
    session.flush()
    spec = RunSpec.from_dict({**expected("good")["spec"], "isolation": "job"})
    first, _ = create_run(session, spec=spec, environment=env, labels=first_labels, requester="detector")
    second, _ = create_run(session, spec=spec, environment=env, labels={"branch": "main"}, requester="ci")
    return first, second


def test_the_self_test_batch_never_goes_ahead_of_a_user_run(db_session: Session, settings: Settings) -> None:
    # the batch was queued first (the service was idle); a user's run arrives after it and is claimed first
    batch, user = _two_runs(db_session, "env-order", {"selftest": "1"})
    assert batch.id < user.id
    claim_queued(db_session, settings=settings, executor="local", limit=1)
    assert (user.state, batch.state) == ("train_submitted", "queued")
    claim_queued(db_session, settings=settings, executor="local", limit=1)
    first = next_pending(db_session)
    assert first is not None and first.run_id == user.id  # its phase starts first too


def test_a_started_runs_next_phase_goes_before_a_later_runs_first(db_session: Session, settings: Settings) -> None:
    older, younger = _two_runs(db_session, "env-started-first", {"branch": "main"})
    claim_queued(db_session, settings=settings, executor="local", limit=2)
    first = next_pending(db_session)
    assert first is not None and first.run_id == older.id
    # the older run's first phase ends and its next one is made now: a newer row than the younger run's
    first.state = PhaseState.SUCCEEDED.value
    following = Phase(run_id=older.id, name="resume", attempt=1, state=PhaseState.PENDING.value, executor="local")
    db_session.add(following)
    db_session.flush()
    pending = {p.run_id: p for p in db_session.scalars(select(Phase).where(Phase.state == PhaseState.PENDING.value))}
    assert following.id > pending[younger.id].id
    nxt = next_pending(db_session)
    assert nxt is not None and nxt.id == following.id
