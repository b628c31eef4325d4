"""A local job gains nothing, reaches nothing and leaves nothing: the review's hostile builds, from inside a job.

Rows 1, 3, 5 and 7 of issue 44: a job made setuid shells in `/var/tmp` and `/dev/shm` that a later job of its
uid used; it reached the node's Postgres on 127.0.0.1:5432; it held the ports every other tenant's rendezvous
needed; it had no cap on processes or memory. Each job now starts in job_sandbox.py (no_new_privs, its own
network with loopback only, its own nosuid /tmp, /var/tmp and /dev/shm, a cgroup with pids.max and
memory.max); a host that cannot give one of them starts no job, naming it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import Settings
from service.executors import isolation, job_leases, job_user, launcher, node_folders
from tests.plugins.job_user import JOB_USER, reachable_folder, require_job_user
from tests.plugins.sandbox_probes import (
    controller_descriptors,
    leave_files,
    leave_ipc,
    link_out,
    no_new_privs,
    reach_from_a_build,
    try_to_gain,
)

FORKS = 100


@pytest.fixture
def base() -> Iterator[Path]:
    with reachable_folder("parity-sandbox") as folder:
        yield folder


@pytest.fixture
def setuid_id() -> Iterator[str]:
    """A setuid-root `id` on the node's root file system (not below a folder the job gets its own of)."""
    folder = Path("/opt") / f"parity-setuid-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    try:
        shutil.copy(shutil.which("id") or "/usr/bin/id", folder / "id")
        os.chmod(folder / "id", 0o4755)
        yield str(folder / "id")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(settings: Settings, base: Path, *args: object, function: Any = try_to_gain, network: bool = False,
         take_back: bool = False) -> Any:
    """Run `function` as a local job; end it and give its lease back (taking its attempt folder back first, as the
    scheduler does, with `take_back`)."""
    import cloudpickle

    import tests.plugins.sandbox_probes as probes

    cloudpickle.register_pickle_by_value(probes)
    folder = base / "runs" / "run-1" / "train" / "attempt-1" / "submitit"
    job = launcher.submit_phase(launcher.JobRequest(
        executor="local", folder=folder, python=sys.executable, tasks=1, name="hostile", function=function,
        args=args, network=network,
    ), settings)
    try:
        return launcher._LOCAL_JOBS[job.job_id].result()
    finally:
        launcher.end_job(job, settings)
        if take_back:
            job_user.take_back(folder.parent, job_user.job_user(settings.job_user), root=settings.resolved_run_folder)
        job_leases.release(settings, folder.parent)


def test_a_hostile_job_gains_reaches_and_keeps_nothing(base: Path, setuid_id: str) -> None:
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, job_pids_max="64",
                        job_memory_max="512M", job_shm_size="64M")
    if isolation.missing(settings):
        pytest.skip(f"this host cannot isolate a local job: {isolation.missing(settings)}")
    with socket.socket() as held:  # a port on the node's loopback, as the review's squatter held 20000-32767
        held.bind(("127.0.0.1", 0))
        held.listen()
        out = _run(settings, base, setuid_id, held.getsockname()[1], FORKS)
    uid = out["uid"]
    assert uid != 0 and out["no_new_privs"] == "1", out
    assert out["setuid_euid"] == str(uid), f"a setuid-root program made the job {out['setuid_euid']}"
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        assert out[f"nosuid {folder}"], f"the job's {folder} allows setuid files or devices: {out}"
        left = [p for p in Path(folder).glob("sh-*") if p.lstat().st_uid == uid]
        assert not left, f"the job left {left} in the node's {folder}"
    assert out["postgres"] == "ConnectionRefusedError", f"the job reached the node's Postgres: {out['postgres']}"
    assert out["postgres socket"] == "FileNotFoundError" and not out["node sockets"], \
        f"the job reached the node's services by their Unix sockets: {out['postgres socket']}, {out['node sockets']}"
    assert out["bind"] == "bound", f"the job's rendezvous port clashed with the node's: {out['bind']}"
    assert out["forked"] < 64 and out.get("fork_refused"), f"no pids.max: {out['forked']} of {FORKS} ran at once"
    assert out["hog"] == -9, f"no memory.max: a 768 MiB allocation under a 512 MiB cap ended {out['hog']}"


def test_a_job_holds_no_descriptor_of_the_schedulers(base: Path) -> None:
    """Issue 55's high row: the local controller inherited the scheduler's stdout and stderr, and a rank took
    them from it (pidfd_getfd, same uid) to write forged lines into the scheduler's log. The controller's
    stdin is /dev/null, its stdout and stderr its own controller.log, and nothing else of this process's."""
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER)
    if isolation.missing(settings):
        pytest.skip(f"this host cannot isolate a local job: {isolation.missing(settings)}")
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            mine.add(os.readlink(f"/proc/self/fd/{fd}"))
    held = _run(settings, base, function=controller_descriptors)
    assert "submitit" in held.pop("controller"), "the rank's parent is not its controller"
    log = str(base / "runs" / "run-1" / "train" / "attempt-1" / "submitit" / "controller.log")
    assert held["0"] == "/dev/null" and held["1"] == log and held["2"] == log, held
    shared = {fd: target for fd, target in held.items() if target in mine - {"/dev/null", log}}
    assert not shared, f"the job's controller holds the scheduler's descriptors: {shared}"


INDEX = "pypi.org"


def test_a_build_reaches_its_package_index_and_nothing_else(base: Path) -> None:
    """A build (a job that needs pip's index: `network=True`) has its own network too: the node's Postgres is not
    there, and its one way out, the index gateway, opens tunnels to PARITY_BUILD_HOSTS only (never to the node
    itself). With the network isolation waived (the defence removed) the same build reaches the node's Postgres."""
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, build_hosts=[INDEX])
    if isolation.missing(settings):
        pytest.skip(f"this host cannot isolate a local job: {isolation.missing(settings)}")
    out = _run(settings, base, INDEX, function=reach_from_a_build, network=True)
    assert out["postgres"] == "ConnectionRefusedError", f"a build reached the node's Postgres: {out}"
    for refused in ("postgres via proxy", "localhost via proxy", "other host via proxy"):
        assert out[refused] == "HTTP/1.1 403 Forbidden", f"{refused}: {out}"
    assert out["index via proxy"] == "HTTP/1.1 200 Connection established", f"the index is out of reach: {out}"
    waived = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, job_isolation_waive="network")
    assert _run(waived, base, INDEX, function=reach_from_a_build, network=True)["postgres"] == "connected"


def test_a_host_that_cannot_isolate_starts_no_job(base: Path) -> None:
    """PARITY_JOB_CGROUP=off stands in for a host without a cgroup: the job does not start and the error
    names what is missing and the setting that would waive it; waived, it runs (the laptop's choice)."""
    if os.geteuid() != 0:
        pytest.skip("as another user nothing is promised (every isolation is waived by default)")
    settings = Settings(executor="local", run_folder=base / "runs", job_cgroup="off")
    with pytest.raises(isolation.IsolationMissing, match=r"cgroup: .*PARITY_JOB_ISOLATION_WAIVE=cgroup,limits"):
        _run(settings, base, "/usr/bin/id", 0, 0)
    assert not (base / "runs" / "run-1" / "train" / "attempt-1" / "submitit").exists() or not any(
        (base / "runs" / "run-1" / "train" / "attempt-1" / "submitit").glob("*_submitted.pkl"))
    waived = Settings(executor="local", run_folder=base / "runs", job_cgroup="off",
                      job_isolation_waive="cgroup,limits")
    out = _run(waived, base, shutil.which("id") or "/usr/bin/id", 0, 0)
    assert out["no_new_privs"] == "1" and out["postgres"] == "ConnectionRefusedError", out
    with pytest.raises(ValueError, match="PARITY_JOB_ISOLATION_WAIVE: unknown 'net'"):
        Settings(job_isolation_waive="net")


def test_what_a_uid_leaves_in_the_nodes_shared_folders_goes_with_its_lease(base: Path) -> None:
    """Where the node's /tmp, /var/tmp and /dev/shm are the job's to write (a Slurm job; a local one with
    mounts waived), every entry its uid made there, a folder with a setuid shell inside one made by someone
    else included, is removed before the uid serves another job (job_leases.remove_files_of)."""
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, job_isolation_waive="mounts")
    shared = Path("/tmp") / f"parity-shared-{uuid.uuid4().hex[:8]}"  # a world-writable folder of another user's
    shared.mkdir()
    shared.chmod(0o1777)
    try:
        left = [Path(p) for p in _run(settings, base, str(shared), function=leave_files)]
        assert left and not [p for p in left if os.path.lexists(p)], f"the job's uid kept {left}"
        # its own folder (the run folder lies below the node's /var/tmp here) is taken back, never removed
        assert (base / "runs" / "run-1" / "train" / "attempt-1" / "submitit").is_dir()
        assert shared.is_dir()  # not the uid's: stays
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_hard_link_out_of_a_jobs_folder_goes_with_its_lease(base: Path) -> None:
    """Issue 55's medium row: a job hard-linked its own 0666 file into the node's /tmp and /var/tmp; taking its
    folder back chowned the shared inode to the service before the lease's sweep looked for the uid's entries, so
    the links stayed, root's and writable by all. The take-back gives a multiply-linked file an inode of its own:
    the links keep the job's uid and go with the lease, the folder keeps the bytes."""
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER, job_isolation_waive="mounts")
    attempt = base / "runs" / "run-1" / "train" / "attempt-1"
    inside, *outside = _run(settings, base, str(attempt), function=link_out, take_back=True)
    try:
        assert not [p for p in outside if os.path.lexists(p)], f"the job's links outlived its lease: {outside}"
        kept = Path(inside).lstat()
        assert kept.st_uid == os.geteuid() and kept.st_nlink == 1 and Path(inside).read_text() == "the job's bytes"
    finally:
        for p in outside:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


def test_what_a_uid_leaves_in_any_world_writable_folder_of_the_node_goes_with_its_lease(base: Path) -> None:
    """The class, not the review's two folders: a node may have other folders every uid may write (an admin's
    drop folder, a distribution's crash folder). A job with every isolation on still sees those as the node's;
    what its uid leaves there (files, a folder, a setuid shell) is removed with its lease (node_folders.py)."""
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER)
    if isolation.missing(settings).keys() - settings.waived_isolations():
        pytest.skip(f"this host cannot isolate a local job: {isolation.missing(settings)}")
    drop = Path("/opt") / f"parity-drop-{uuid.uuid4().hex[:8]}"  # outside /tmp, /var/tmp, /dev/shm and /run
    drop.mkdir()
    drop.chmod(0o1777)
    node_folders.forget()  # made after this process last looked
    try:
        left = [Path(p) for p in _run(settings, base, str(drop), function=leave_files) if p.startswith(str(drop))]
        assert len(left) == 2 and not [p for p in left if os.path.lexists(p)], f"the job's uid kept {left}"
        assert drop.is_dir()  # not the uid's: stays
    finally:
        shutil.rmtree(drop, ignore_errors=True)
        node_folders.forget()


def test_the_folders_any_uid_may_write_are_found_where_others_may_reach_them(tmp_path: Path) -> None:
    """What the walk finds: a world-writable folder others can reach (once, not what lies inside it), never
    one behind a folder others cannot pass, nor a link to one."""
    (tmp_path / "open" / "inner").mkdir(parents=True)
    (tmp_path / "open").chmod(0o1777)
    (tmp_path / "open" / "inner").chmod(0o777)
    (tmp_path / "closed" / "drop").mkdir(parents=True)
    (tmp_path / "closed").chmod(0o700)
    (tmp_path / "closed" / "drop").chmod(0o1777)
    (tmp_path / "plain").mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(tmp_path / "open")
    tmp_path.chmod(0o755)
    assert node_folders.writable_by_all(str(tmp_path)) == [str(tmp_path / "open")]
    assert node_folders.outermost(["/tmp", "/tmp/a", "/tmpx", "/var/tmp/"]) == ("/tmp", "/tmpx", "/var/tmp")


def _ipc_keys_on_the_node() -> set[int]:
    keys = set()
    for kind in ("shm", "sem", "msg"):
        for line in Path("/proc/sysvipc", kind).read_text().splitlines()[1:]:
            keys.add(int(line.split()[0]))
    return keys


@pytest.mark.parametrize("waived", ["", "mounts"])
def test_the_sysv_ipc_a_job_makes_dies_with_it(base: Path, waived: str) -> None:
    """SysV shared memory, semaphores and message queues outlive every process: a local job makes them in an
    IPC namespace of its own (gone with it: never on the node at all), and where it shares the node's (mounts
    waived, as a Slurm job does) its uid's are removed with its lease (job_leases.remove_ipc_of)."""
    require_job_user()
    settings = Settings(executor="local", run_folder=base / "runs", job_user=JOB_USER,
                        job_isolation_waive=waived or None)
    if isolation.missing(settings).keys() - settings.waived_isolations():
        pytest.skip(f"this host cannot isolate a local job: {isolation.missing(settings)}")
    keys = set(_run(settings, base, function=leave_ipc))
    assert len(keys) == 3 and not keys & _ipc_keys_on_the_node(), "the job's SysV IPC outlived its lease"


def test_a_uids_ipc_is_what_it_owns_or_created_and_nothing_else(tmp_path: Path) -> None:
    """What the lease's sweep removes, read as /proc/sysvipc lists it: the uid's objects (owned, or created and
    handed to another uid), never another's."""
    (tmp_path / "shm").write_text(
        "       key      shmid perms       size  cpid  lpid nattch   uid   gid  cuid  cgid\n"
        "   1433715          4   600         56  2237  1360      5   101   104   101   104\n"
        "  98765432          7   666       4096  3000     0      0  1001  1001  1001  1001\n")
    (tmp_path / "sem").write_text("       key      semid perms      nsems   uid   gid  cuid  cgid\n"
                                  "  12345678          9   600          1   101   101  1001  1001\n")
    (tmp_path / "msg").write_text("key msqid perms cbytes qnum lspid lrpid uid gid cuid cgid\n")
    assert job_leases.ipc_of(1001, tmp_path) == [("shm", 7), ("sem", 9)]
    assert job_leases.ipc_of(4242, tmp_path) == []


@pytest.mark.slurm
def test_a_slurm_job_runs_with_no_new_privs(base: Path, slurm: str) -> None:
    """A Slurm job's program starts under `setpriv --no-new-privs`: a setuid file on the node gains it nothing."""
    import cloudpickle

    import tests.plugins.sandbox_probes as probes

    require_job_user()
    cloudpickle.register_pickle_by_value(probes)
    settings = Settings(executor="slurm", run_folder=base / "runs", job_user=JOB_USER)
    folder = base / "runs" / "run-1" / "train" / "attempt-1" / "submitit"
    job = launcher.submit_phase(launcher.JobRequest(
        executor="slurm", folder=folder, python=sys.executable, tasks=1, name="nnp", function=no_new_privs, args=(),
    ), settings)
    try:
        assert launcher._submitit_job(job).result() == "1"
    finally:
        launcher.end_job(job, settings)
        job_leases.release(settings, folder.parent)
