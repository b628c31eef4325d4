"""The job user's folders and the disk quota, piece by piece (fast: no build, no Megatron).

tests/security/test_hostile_builds.py shows the same defences end to end against a hostile build.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from jobs.spec import RunSpec
from models import Environment
from service.core.settings import Settings, get_settings, parse_size
from service.executors import job_home, job_leases, job_user, launcher
from service.executors.launcher import PhaseJob
from service.executors.local_jobs import start_time
from service.runs.records import create_run
from service.scheduler import reconciler
from service.scheduler.reconciler import reconcile
from service.scheduler.submitter import claim_queued, launch, next_pending
from tests.plugins.job_user import JOB_USER, require_job_user

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3, "isolation": "job"}


@pytest.fixture
def user() -> job_user.JobUser:
    require_job_user()
    return job_user.JobUser.lookup(JOB_USER)


@pytest.fixture
def root() -> Iterator[Path]:
    base = Path("/var/tmp") / f"parity-jobuser-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o711)
    yield base / "runs"
    shutil.rmtree(base, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode) & 0o777


def test_a_folder_is_the_jobs_only_while_it_runs(user: job_user.JobUser, root: Path) -> None:
    attempt = root / "run-3" / "train_and_save" / "attempt-1"
    job_user.prepare_tree(root, attempt, user)
    job_user.open_gate(root / "run-3", user)
    job_user.grant(attempt, user, root=root)
    assert attempt.stat().st_uid == user.uid and _mode(attempt) == 0o770
    assert _mode(root) == _mode(root / "run-3") == 0o751  # passable, never listable or writable
    (attempt / "checkpoint").mkdir()
    os.chown(attempt / "checkpoint", user.uid, user.gid)  # as the job would have made it
    job_user.take_back(attempt, user, root=root)
    job_user.close_gate(root / "run-3", user)
    assert attempt.stat().st_uid == os.geteuid() and (attempt / "checkpoint").stat().st_uid == os.geteuid()
    assert _mode(root / "run-3") == job_user.GATE_CLOSED_MODE  # a finished run: no job passes


def test_taking_back_never_follows_a_link_the_job_left(user: job_user.JobUser, root: Path) -> None:
    attempt = root / "run-4" / "resume" / "attempt-1"
    job_user.prepare_tree(root, attempt, user)
    job_user.grant(attempt, user, root=root)
    elsewhere = root.parent / "someone-elses"
    elsewhere.write_text("not the job's")
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(elsewhere, nobody, nobody)
    (attempt / "result.rank0.json").symlink_to(elsewhere)  # the attack: chown my "result" for me
    os.lchown(attempt / "result.rank0.json", user.uid, user.gid)
    job_user.take_back(attempt, user, root=root)
    assert elsewhere.stat().st_uid == nobody, "taking back followed the job's link and re-owned its target"
    assert (attempt / "result.rank0.json").lstat().st_uid == os.geteuid()


def test_without_a_job_user_folders_stay_the_services_alone(root: Path) -> None:
    attempt = root / "run-5" / "train_and_save" / "attempt-1"
    job_user.prepare_tree(root, attempt, None)
    job_user.grant(attempt, None, root=root)
    assert {_mode(p) for p in (root, root / "run-5", attempt)} == {0o700}
    assert job_user.job_user(None) is None


def test_a_job_user_that_is_missing_root_or_the_service_is_refused() -> None:
    with pytest.raises(job_user.JobUserError, match="no user named 'no-such-user-x'"):
        job_user.JobUser.lookup("no-such-user-x")
    with pytest.raises(job_user.JobUserError, match="root is not a job user"):
        job_user.JobUser.lookup("root")


@pytest.mark.parametrize("value,problem", [
    ("lots", "is not a size"), ("0", "between 1M and 1P"), ("99999999999999999T", "is not a size"),
    ("2\x00G", "is not a size"), ("²G", "is not a size"), ("1G", None), ("512MiB", None),
])
def test_the_quota_setting_names_itself_when_wrong(value: str, problem: str | None) -> None:
    if problem is None:
        assert parse_size(value) > 0
        return
    with pytest.raises(ValueError, match=f"PARITY_RUN_DISK_QUOTA: .*{problem}"):
        parse_size(value)


@pytest.fixture
def small_quota(settings_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("PARITY_EXECUTOR", "local")
    monkeypatch.setenv("PARITY_RUN_DISK_QUOTA", "1M")
    get_settings.cache_clear()
    reconciler._last_check.clear()
    yield get_settings()
    get_settings.cache_clear()


def test_an_attempt_past_its_quota_ends_the_run_with_that_cause(
    db_session: Session, small_quota: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a live local "job": a process leading its own session, known by pid and start time
    job = subprocess.Popen(["sleep", "300"], start_new_session=True)
    monkeypatch.setattr(launcher, "submit_phase", lambda request, _settings: PhaseJob(
        executor="local", folder=str(request.folder), job_id=str(job.pid), tasks=request.tasks,
        started=start_time(job.pid)))
    try:
        _past_quota(db_session, small_quota, job)
    finally:
        job.kill()
        job.wait()


def _past_quota(db_session: Session, small_quota: Settings, job: subprocess.Popen[bytes]) -> None:
    env = Environment(name="env-quota", python="/usr/bin/python3", packages={})
    db_session.add(env)
    db_session.flush()
    run, _ = create_run(db_session, spec=RunSpec.from_dict(SPEC), environment=env, labels={}, requester="t")
    claim_queued(db_session, settings=small_quota, executor="local")
    phase = next_pending(db_session)
    assert phase is not None
    launch(db_session, phase, settings=small_quota, executor="local")
    attempt = Path(phase.folder or "")
    attempt.mkdir(parents=True, exist_ok=True)
    (attempt / "under.bin").write_bytes(b"x" * (512 << 10))
    reconcile(db_session, settings=small_quota, executor="local")
    assert phase.state in ("submitted", "running")  # under the quota: nothing happens (the known-good side)
    reconciler._last_check.clear()
    for i in range(3):  # each file under the quota, together past it
        (attempt / f"fill-{i}.bin").write_bytes(b"x" * (512 << 10))
    reconcile(db_session, settings=small_quota, executor="local")
    assert phase.state == "infra_failed" and run.state == "error", (phase.state, run.state)
    message = run.error_message or ""
    assert "disk quota exceeded" in message and "PARITY_RUN_DISK_QUOTA=1M" in message, message
    assert "not a parity result" in message
    assert job.wait(timeout=15) is not None  # the job was stopped (its process group killed)


def test_a_file_stopped_at_the_per_file_limit_is_named_as_the_cause(tmp_path: Path, small_quota: Settings) -> None:
    assert reconciler.file_at_limit(tmp_path, small_quota) is None
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "small.pt").write_bytes(b"x" * 1000)
    assert reconciler.file_at_limit(tmp_path, small_quota) is None  # the known-good side
    (tmp_path / "checkpoint" / "model.pt").write_bytes(b"x" * (1 << 20))  # where RLIMIT_FSIZE stopped it
    why = reconciler.file_at_limit(tmp_path, small_quota)
    assert why is not None and "checkpoint/model.pt reached PARITY_RUN_DISK_QUOTA=1M" in why, why


def test_a_job_users_build_may_not_write_a_shared_python_base(user: job_user.JobUser, root: Path) -> None:
    """A base venv is imported by every build on its Python: one build writing it could poison the rest.

    As the job user, an unprepared base is refused with the command that prepares it; a prepared
    (service-owned, ready) base is used as it is.
    """
    builds = root / "environments"
    builds.mkdir(parents=True)
    os.chmod(root.parent, 0o711)
    os.chmod(root, 0o755)
    os.chmod(builds, 0o755)
    probe = (
        "import json, sys; from pathlib import Path; from service.environments.python_base import ensure_base\n"
        "def run(*a): raise SystemExit('the job user tried to build the base')\n"
        f"log = Path('/tmp/parity-base-{uuid.uuid4().hex[:8]}.log')\n"
        f"try:\n    print(ensure_base(Path({str(builds)!r}), '3.99', sys.executable, ['torch==1'], run, log))\n"
        "except PermissionError as exc:\n    print('REFUSED', exc)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    as_job = ["runuser", "-u", user.name, "--", os.path.realpath(f"{repo}/.venv/bin/python"), "-c", probe]
    refused = subprocess.run(as_job, capture_output=True, text=True, cwd=repo, check=True).stdout
    print(refused)
    assert refused.startswith("REFUSED") and "parity pythons prepare 3.99" in refused
    base = builds / "pythons" / "3.99"  # what `parity pythons prepare` leaves, as the service's user
    (base / "venv" / "lib" / "python3.99" / "site-packages").mkdir(parents=True)
    (base / "ready.json").write_text('{"pins": ["torch==1"]}')
    os.chmod(base, 0o755)
    used = subprocess.run(as_job, capture_output=True, text=True, cwd=repo, check=True).stdout
    assert used.strip().endswith("python3.99/site-packages"), used


def test_a_job_that_goes_on_keeps_its_private_home_until_it_ends(user: job_user.JobUser, root: Path) -> None:
    """Isolation "process": the saver's attempt is taken back while its job runs the resume, which still
    needs its HOME and TMPDIR; they are the service's again once the job ends."""
    from models import Phase
    from service.scheduler.submitter import release_folders

    settings = Settings(run_folder=root, job_user=JOB_USER, executor="local")
    attempt = root / "run-4" / "train_and_save" / "attempt-1"
    leased = launcher.hand_over(settings, attempt / "submitit", gate=root / "run-4")  # the job's own user
    assert leased is not None and leased.name.startswith(f"{user.name}-")  # one of the pool (job_leases)
    private = attempt / job_home.PRIVATE
    assert private.stat().st_uid == (private / "tmp").stat().st_uid == leased.uid
    phase = Phase(run_id=4, name="train_and_save", attempt=1, folder=str(attempt), executor="local")
    release_folders(settings, phase, job_continues=True)
    assert attempt.stat().st_uid == os.geteuid()
    assert (private / "tmp").stat().st_uid == leased.uid and (attempt / "submitit").stat().st_uid == leased.uid
    assert job_leases.leased(settings, attempt)  # the job goes on: its user stays its own
    release_folders(settings, phase)
    assert not job_leases.leased(settings, attempt)  # the job ended: its user is back in the pool
    assert (private / "tmp").stat().st_uid == os.geteuid()


def test_a_checkout_the_job_user_cannot_reach_is_named_before_any_job_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clone in a private folder (0700, as mktemp -d makes): the job user could not exec its venv's Python,
    and the job died with nothing on stderr. The lookup now refuses, naming the folder in the way."""
    require_job_user()
    private = Path(tempfile.mkdtemp(dir="/var/tmp"))  # mode 0700
    try:
        venv_python = private / ".venv" / "bin" / "python"
        venv_python.parent.mkdir(parents=True)
        venv_python.symlink_to(Path(sys.executable).resolve())
        monkeypatch.setattr(sys, "executable", str(venv_python))
        with pytest.raises(job_user.JobUserError) as refused:
            job_user.JobUser.lookup(JOB_USER)
        assert f"the folder {private} (0o700)" in str(refused.value) and "o+x" in str(refused.value)
        private.chmod(0o701)  # what scripts/setup.sh does as root: passable, still not listable
        assert job_user.JobUser.lookup(JOB_USER).name == JOB_USER
    finally:
        shutil.rmtree(private, ignore_errors=True)
