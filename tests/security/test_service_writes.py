"""The scheduler (root) never writes through a link a job planted: the review overwrote a root-only file
by planting a link named like the scheduler's cancel temp file in its warm worker's folder, then
cancelling its own run.

Every file the service creates in a folder a job may write is made by directory descriptor with
O_EXCL | O_NOFOLLOW (jobs/pool_folder.py; the job's private HOME: service/executors/launcher.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs.pool_folder import PoolFolder
from service.core.settings import Settings
from service.executors import job_home, job_user, launcher, pool

JOB_USER = "parity-job"


@pytest.fixture
def worker(tmp_path: Path) -> tuple[Settings, pool.Worker, Path]:
    """A warm worker's folder as its job leaves it (the job user's, when there is one) and a root-only file."""
    settings = Settings(run_folder=tmp_path / "runs", executor="local")
    files = PoolFolder(pool.pool_root(settings) / "e1-t1-abc")
    run_as = None
    if os.geteuid() == 0:
        try:
            run_as = job_user.JobUser.lookup(JOB_USER)
        except job_user.JobUserError:
            run_as = None
    job_user.prepare_tree(settings.resolved_run_folder, files.folder, run_as)
    job_user.grant(files.folder, run_as, root=settings.resolved_run_folder)
    victim = tmp_path / "root-only.conf"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    return settings, pool.Worker(files, {"tasks": 1}), victim


def test_cancelling_a_warm_order_never_writes_through_a_planted_link(
    worker: tuple[Settings, pool.Worker, Path],
) -> None:
    settings, w, victim = worker
    planted = w.files.folder / f".cancel.json.{os.getpid()}.tmp"  # the scheduler's temporary name
    planted.symlink_to(victim)
    os.lchown(planted, *_owner(w.files.folder))
    pool.cancel_warm(settings, pool.warm_name(w, "order-1"))
    assert victim.read_text() == "precious\n", "the scheduler wrote through the job's link"
    assert not planted.is_symlink() and not w.files.cancel.is_symlink()
    assert json.loads(w.files.cancel.read_text()) == {"order": "order-1"}


def test_a_link_where_the_cancel_file_goes_is_replaced_not_followed(worker: tuple[Settings, pool.Worker, Path]) -> None:
    settings, w, victim = worker
    w.files.cancel.symlink_to(victim)
    pool.cancel_warm(settings, pool.warm_name(w, "order-2"))
    assert victim.read_text() == "precious\n"
    assert not w.files.cancel.is_symlink() and json.loads(w.files.cancel.read_text()) == {"order": "order-2"}


def test_an_order_is_never_placed_through_a_link(worker: tuple[Settings, pool.Worker, Path]) -> None:
    _, w, victim = worker
    w.files.order.symlink_to(victim)  # a link where the order goes counts as an order in force
    assert not pool.place(w, "order-3", "attempt", [], [])
    assert victim.read_text() == "precious\n"
    assert not [p for p in w.files.folder.iterdir() if p.name.startswith(".order.")]  # no temp file left
    w.files.order.unlink()
    assert pool.place(w, "order-3", "attempt", [], [])
    assert json.loads(w.files.order.read_text())["id"] == "order-3" and not w.files.order.is_symlink()


def test_a_jobs_private_home_is_made_by_descriptor(tmp_path: Path, worker: tuple[Settings, pool.Worker, Path]) -> None:
    """A link left where the next job's HOME goes is removed, never followed (the hand-over makes it)."""
    settings, _, _ = worker
    attempt = settings.resolved_run_folder / "run-1" / "train" / "attempt-1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    attempt.mkdir(parents=True)
    (attempt / job_home.PRIVATE).symlink_to(elsewhere)
    launcher.hand_over(settings, attempt / "submitit")
    assert not any(elsewhere.iterdir()) and (attempt / job_home.PRIVATE / "home").is_dir()


def _owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid
