"""Jobs see an allow-listed environment: the scheduler's secrets never reach the code under test."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Literal

import cloudpickle
import pytest
import submitit

from service.core.settings import Settings
from service.executors import job_home, job_user, launcher

# Jobs unpickle this function in a fresh interpreter where this test module is not importable.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SECRETS = {
    "PARITY_DATABASE_URL": "postgresql+psycopg://parity:hunter2@db:5432/parity",
    "PARITY_TOKEN": "prt_very-secret",
    "AWS_SECRET_ACCESS_KEY": "also-secret",
}


def job_environment() -> dict[str, str]:
    """What a job process sees."""
    return dict(os.environ)


def _submit(executor: Literal["local", "slurm"], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PARITY_FAST_EXIT", "0")  # a job-side knob on the allow-list
    monkeypatch.setenv("PARITY_INJECT_FAULT", "save:1")  # a test variable of old: never reaches a job
    settings = Settings(executor=executor, run_folder=tmp_path / "runs", slurm_time_limit_min=5,
                        job_env=["EXTRA_ALLOWED"])
    monkeypatch.setenv("EXTRA_ALLOWED", "yes")
    before = dict(os.environ)
    job = launcher.submit_phase(launcher.JobRequest(
        executor=executor, folder=tmp_path / "runs" / "run-1" / "probe-attempt1", python=sys.executable, tasks=1,
        name="env-probe", function=job_environment, args=(),
    ), settings)
    assert dict(os.environ) == before, "the scheduler's own environment must be restored after submitting"
    handle: submitit.Job[dict[str, str]]
    if executor == "slurm":
        handle = submitit.SlurmJob(job.folder, job.job_id)
    else:
        handle = launcher._LOCAL_JOBS[job.job_id]
    result = handle.result()
    launcher.end_job(job, settings)  # as the scheduler does when a phase ends (a local job's cgroup goes)
    return result


def _assert_clean(env: dict[str, str]) -> None:
    _assert_private(env)
    leaked = sorted(name for name in SECRETS if name in env)
    assert not leaked, f"secrets reached the job: {leaked}"
    assert not any("hunter2" in value or "prt_very-secret" in value for value in env.values())
    assert env.get("PARITY_FAST_EXIT") == "0" and env.get("EXTRA_ALLOWED") == "yes"
    assert "PARITY_INJECT_FAULT" not in env
    assert "PATH" in env and env.get("PYTHONPATH")


PRIVATE = ("HOME", "TMPDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "PIP_CACHE_DIR", "PYTHONUSERBASE")


def _assert_private(env: dict[str, str]) -> None:
    """Home, temporary files, XDG folders and pip's cache are the job's own, inside its folder, and fresh."""
    for name in PRIVATE:
        where = Path(env[name])
        assert job_home.PRIVATE in where.parts and where.is_relative_to(Path(env["TMPDIR"]).parent), (name, where)
    assert "/run-1/.private/" in env["HOME"]  # the submitit folder's parent: the granted folder
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PYTHONNOUSERSITE"] == "1"


def test_a_local_job_gets_only_the_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _assert_clean(_submit("local", tmp_path, monkeypatch))


def test_a_slurm_job_gets_only_the_allow_list(slurm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _submit("slurm", tmp_path, monkeypatch)
    _assert_clean(env)
    assert env.get("SLURM_JOB_ID")  # it really ran under Slurm


def test_a_private_home_is_made_fresh_and_never_through_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "attempt"
    env = job_home.make_private(folder)
    (Path(env["XDG_CONFIG_HOME"]) / "pip").mkdir()
    (Path(env["XDG_CONFIG_HOME"]) / "pip" / "pip.conf").write_text("[install]\nrequirement = /evil\n")
    again = job_home.make_private(folder)  # the next job in the same folder (a build made again)
    assert again == env and not (Path(env["XDG_CONFIG_HOME"]) / "pip").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(folder / job_home.PRIVATE)
    (folder / job_home.PRIVATE).symlink_to(elsewhere)  # what a job could leave for the service to follow
    job_home.make_private(folder)
    assert not any(elsewhere.iterdir()) and not (folder / job_home.PRIVATE).is_symlink()


def test_run_folders_are_private(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    folder = root / "run-7" / "train_and_save-attempt1"
    root.mkdir(mode=0o755)
    job_user.prepare_tree(root, folder, None)  # no PARITY_JOB_USER: the service's own, 0700 all the way
    job_user.grant(folder, None, root=root)
    for path in (root, root / "run-7", folder):
        assert path.stat().st_mode & 0o777 == 0o700, path


def test_the_allow_list_drops_everything_else() -> None:
    env = launcher.job_environment({"PATH": "/bin", "SLURM_JOB_ID": "3", "PARITY_DATABASE_URL": "x", "HOME": "/h",
                                    "GITHUB_TOKEN": "t", "LC_ALL": "C"})
    assert env == {"PATH": "/bin", "SLURM_JOB_ID": "3", "HOME": "/h", "LC_ALL": "C"}


def test_submitting_never_changes_the_service_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the job's environment is handed to the executor, never swapped into os.environ: a thread of the
    # service reading its own environment while a phase is submitted always finds its database URL
    import threading

    seen_without: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            if "PARITY_DATABASE_URL" not in os.environ:
                seen_without.append(1)

    reader = threading.Thread(target=read, daemon=True)
    monkeypatch.setenv("PARITY_DATABASE_URL", SECRETS["PARITY_DATABASE_URL"])
    reader.start()
    try:
        env = _submit("local", tmp_path, monkeypatch)
    finally:
        stop.set()
        reader.join()
    _assert_clean(env)
    assert not seen_without, "os.environ was emptied while a job was submitted"
