"""A job leaves nothing for the next one: the review's poisoned pip config, and what a phase leaves running.

The review's attack: a hostile build's install code wrote `~/.config/pip/pip.conf` naming an extra
requirement (a fake Megatron-Core); the next build, another tenant's wheel with no Megatron at all,
installed it and passed its import check. The poisoner here also writes uv's `uv.toml` (builds install
with uv): read, it would leave the next build without an index. Each job now gets a fresh HOME, TMPDIR, XDG folders and
pip cache inside its own folder, pip reads no configuration file, and Python no user site-packages.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from models import Environment
from service.core.db import session_scope
from service.core.settings import Settings, get_settings
from service.environments.registry import request_build
from service.executors import isolation
from service.executors.job_home import VAR_TMP
from tests.plugins.daemons import leave_a_daemon
from tests.plugins.hostile_package import build_to_end
from tests.plugins.wheels import wheel_bytes

pytestmark = pytest.mark.timeout(900)  # past the 300 s ceiling: real builds or many real runs

JOB_USER = "parity-job"
CURE = "fake_megatron_core-0.0.1-py3-none-any.whl"


POISONER = textwrap.dedent('''
    import os
    from setuptools import setup

    # everywhere pip looks for a user's configuration: the next build that reads it installs the "cure"
    conf = "[install]\\nrequirement = %(requirements)s\\n"
    home = os.path.expanduser("~")
    for folder in {os.path.join(home, ".config", "pip"), os.path.join(home, ".pip"),
                   os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "pip")}:
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "pip.conf"), "w") as fh:
                fh.write(conf)
        except OSError:
            pass
    # and uv's: a build that read it could reach no index (the next build's setuptools never comes)
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for folder in {os.path.join(home, ".config", "uv"), os.path.join(config, "uv")}:
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "uv.toml"), "w") as fh:
                fh.write("[pip]\\nno-index = true\\n")
        except OSError:
            pass
    with open(os.path.join(%(report)r, "poisoner-home.txt"), "w") as fh:
        fh.write(home)
    setup(name="poisoner", version="1.0", py_modules=[])
''')
INNOCENT = 'from setuptools import setup\nsetup(name="innocent", version="1.0", py_modules=[])\n'


def require_job_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("the scheduler must be root to run jobs as another user")
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        if os.environ.get("PARITY_REQUIRE_JOB_USER") == "1":
            pytest.fail(f"no user {JOB_USER}: run scripts/job-user.sh")
        pytest.skip(f"no user {JOB_USER}: run scripts/job-user.sh")


@pytest.fixture(params=[pytest.param("service-user", marks=pytest.mark.nightly), "job-user"])
def scene(request: pytest.FixtureRequest, committed_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A run folder the job user can reach, and a HOME of the scheduler's own that a job could once write."""
    if request.param == "job-user":
        require_job_user()
        monkeypatch.setenv("PARITY_JOB_USER", JOB_USER)
    # /tmp/pytest-of-root is 0700: the job user could not reach a run folder below it
    base = Path("/var/tmp") / f"parity-iso-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    home = base / "scheduler-home"  # the scheduler's HOME: a job that inherits it writes there (never ~root)
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("PARITY_RUN_FOLDER", str(base / "runs"))
    get_settings.cache_clear()
    try:
        yield base
    finally:
        get_settings.cache_clear()
        shutil.rmtree(base, ignore_errors=True)


def _source(base: Path, name: str, setup_py: str) -> Path:
    folder = base / "src" / name
    folder.mkdir(parents=True, mode=0o755)
    (base / "src").chmod(0o755)
    (folder / "setup.py").write_text(setup_py)
    return folder


def _build(settings: Settings, source: Path, timeout_s: float = 600) -> Environment:
    with session_scope() as session:
        env, _ = request_build(session, requirements=[str(source)], settings=settings)
        env_id = env.id
    return build_to_end(settings, env_id, "local", timeout_s, f"the build of {source.name}")


@pytest.mark.nightly  # two real builds; the PR tier's hostile build is test_hostile_builds' local one
@pytest.mark.slow  # two real builds, ~1 min
def test_a_build_cannot_poison_the_next_builds_pip(scene: Path) -> None:
    settings = get_settings()
    cure = scene / "cure"
    cure.mkdir(mode=0o755)
    fake = {"megatron/__init__.py": "", "megatron/core/__init__.py": "__version__ = '0.0.1'\n"}
    (cure / CURE).write_bytes(wheel_bytes("fake-megatron-core", "0.0.1", fake))
    (cure / "requirements.txt").write_text(f"{cure / CURE}\n")
    report = scene / "report"
    report.mkdir(mode=0o755)
    # the install code's report: a file the test owns that the job may write, so the sweep of what the job's
    # uid leaves below the node's /var/tmp at the end of its lease (job_leases.remove_files_of) keeps it
    (report / "poisoner-home.txt").touch(mode=0o666)
    (report / "poisoner-home.txt").chmod(0o666)
    poisoner = _source(scene, "poisoner", POISONER % {"requirements": cure / "requirements.txt",
                                                      "report": str(report)})
    first = _build(settings, poisoner)  # its install code ran (its own outcome does not matter)
    written = (report / "poisoner-home.txt").read_text()
    assert written, "the poisoner's install code did not run"
    home = Path(written)
    assert home.is_relative_to(Path(first.folder or "")), f"the build's HOME {home} is outside its own folder"
    victim = _build(settings, _source(scene, "innocent", INNOCENT))
    assert victim.state == "failed", "a build with no Megatron-Core passed: the poisoned pip config installed one"
    assert "megatron" in (victim.error_message or ""), victim.error_message
    assert "fake-megatron-core" not in " ".join(victim.freeze or [])




def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pid: int) -> bool:
    """Neither running nor a zombie waiting to be reaped."""
    import psutil

    return not psutil.pid_exists(pid)


@pytest.mark.parametrize("as_job_user", [False, True], ids=["service-user", "job-user"])
def test_a_daemon_a_job_leaves_is_killed_when_the_job_ends(as_job_user: bool) -> None:
    import cloudpickle
    import submitit

    from service.executors import job_cgroup, launcher

    if as_job_user:
        require_job_user()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    base = Path("/var/tmp") / f"parity-daemon-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER if as_job_user else None)
    if job_cgroup.jobs_root(settings.job_cgroup) is None:
        pytest.skip("no writable cgroup v2 here: docs/security.md says what survives a job without one")
    folder = base / "runs" / "run-1" / "train" / "attempt-1" / "submitit"
    pid_file = folder.parent / "daemon.pid"
    try:
        job = launcher.submit_phase(launcher.JobRequest(
            executor="local", folder=folder, python=sys.executable, tasks=1, name="daemon", function=leave_a_daemon,
            args=(str(pid_file),),
        ), settings)
        handle: submitit.Job[int] = launcher._LOCAL_JOBS[job.job_id]
        pid = handle.result()
        assert _alive(pid), "the daemon should still run once its job returned (that is the attack)"
        assert launcher.poll([job])[job].kind == "done"
        left = launcher.end_job(job, settings)  # what the scheduler does when the phase ends
        assert left >= 1 and not _alive(pid), "a setsid daemon outlived its job"
        deadline = time.monotonic() + 10
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), "the killed daemon was left a zombie"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def write_to_tmp(name: str) -> str:
    """A job that writes into /tmp, /var/tmp and /dev/shm (the review filled the node's /tmp past its quota
    this way, and left setuid shells in /var/tmp and /dev/shm for a later job of the same uid)."""
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        Path(folder, name).write_bytes(b"x" * 1024)
    return os.environ["TMPDIR"]


@pytest.mark.parametrize("node_tmp", ["/var/tmp", "/tmp"])
def test_a_local_jobs_tmp_is_its_own_folder(node_tmp: str) -> None:
    """Also with the run folder under the node's /tmp (a clone in `mktemp -d`: its interpreter and checkout
    are there too), where the job once got the node's /tmp instead: what it needs is bound back in."""
    import cloudpickle
    import submitit

    from service.executors import launcher

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    base = Path(node_tmp) / f"parity-tmp-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    settings = Settings(executor="local", run_folder=base / "runs")
    if {"cgroup", "mounts"} & set(isolation.missing(settings)):
        pytest.skip("no cgroup v2 or mount namespace here: local jobs do not start (or share the node's /tmp, waived)")
    name = f"parity-tmp-{uuid.uuid4().hex}"
    folder = base / "runs" / "run-1" / "train" / "attempt-1" / "submitit"
    try:
        job = launcher.submit_phase(launcher.JobRequest(
            executor="local", folder=folder, python=sys.executable, tasks=1, name="tmp", function=write_to_tmp,
            args=(name,),
        ), settings)
        handle: submitit.Job[str] = launcher._LOCAL_JOBS[job.job_id]
        own_tmp = Path(handle.result())
        launcher.end_job(job, settings)
        for node in ("/tmp", "/var/tmp", "/dev/shm"):
            assert not Path(node, name).exists(), f"the job wrote into the node's {node}"
        assert (own_tmp / name).is_file() and own_tmp.is_relative_to(folder.parent)  # in its folder and quota
        assert (own_tmp.parent / VAR_TMP / name).is_file()  # its /var/tmp too
    finally:
        for node in ("/tmp", "/var/tmp", "/dev/shm"):
            Path(node, name).unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
