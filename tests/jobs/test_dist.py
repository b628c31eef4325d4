"""Rendezvous ports (derived alike on every rank, clear of the kernel's ephemeral ports) and CPU threads."""

from __future__ import annotations

import os
import signal
import socket

import pytest


def test_job_master_port_is_shared_and_below_the_ephemeral_range() -> None:
    from jobs.rank.dist import LOWEST_MASTER_PORT, _ephemeral_floor, job_master_port

    ports = {job_master_port(str(job_id)) for job_id in range(1000, 1100)}
    assert len(ports) == 100  # consecutive jobs never share a port
    assert all(LOWEST_MASTER_PORT <= p < _ephemeral_floor() for p in ports)
    assert job_master_port("4242") == job_master_port("4242")


def test_cpu_threads_share_the_cores_and_keep_to_the_slurm_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.rank import dist

    monkeypatch.setattr(dist.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert [dist.cpu_threads(n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]  # outside Slurm: the host's cores
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert dist.cpu_threads(1) == 1  # a DP 1 job given one CPU does not spread over the host
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert [dist.cpu_threads(1), dist.cpu_threads(2)] == [3, 2]
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "")
    assert dist.cpu_threads(1) == 4


@pytest.mark.skipif(os.geteuid() != 0, reason="listening as another user needs root")
def test_a_port_another_user_listens_on_is_stepped_over_and_our_own_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker's or another tenant's listener on the derived port failed rank 0 with EADDRINUSE."""
    from jobs.rank.dist import LOWEST_MASTER_PORT, _ephemeral_floor, job_master_port

    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    monkeypatch.delenv("SLURM_NNODES", raising=False)
    first = job_master_port("4242", 1)
    listener = _listen_as(65534, first)  # nobody listens on the job's port, as RabbitMQ did on 25672
    try:
        moved = job_master_port("4242", 1)
        assert moved != first and LOWEST_MASTER_PORT <= moved < _ephemeral_floor()
        assert moved % 2 == first % 2  # still the phase child's own index in its block
        with socket.socket() as own:  # rank 0's store on the moved port: the other ranks still find it
            own.bind(("127.0.0.1", moved))
            own.listen()
            assert job_master_port("4242", 1) == moved
        monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")  # other nodes cannot see the master's table alike
        assert job_master_port("4242", 1) == first
    finally:
        os.kill(listener, signal.SIGKILL)
        os.waitpid(listener, 0)
    monkeypatch.delenv("SLURM_JOB_NUM_NODES")
    assert job_master_port("4242", 1) == first


def _listen_as(uid: int, port: int) -> int:
    """Fork a child that becomes `uid` and listens on 127.0.0.1:`port`; return its pid once it listens."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exec, so no interpreter path the other uid must be able to reach
        try:
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            os.write(ready_w, b"1")
            signal.pause()
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1", "the listener did not start"
    os.close(ready_r)
    return pid


def test_a_peer_waits_for_rank_0s_store_to_listen_without_a_backoff() -> None:
    """Rank 1 asked before rank 0's store listened: it goes on once the listener appears (torch's own client
    retry backed off 0.3-0.8 s in every phase of a warm worker), and gives up after its timeout when none does."""
    import socket
    import threading
    import time

    from jobs.rank.dist import free_port, wait_until_listening

    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    listener = threading.Thread(target=listen_later)
    listener.start()
    t0 = time.monotonic()
    wait_until_listening("127.0.0.1", port, timeout_s=10)
    listener.join()
    assert 0.29 < time.monotonic() - t0 < 5  # after the listener, not before (speed: gate_latency.py)
    server.close()
    t0 = time.monotonic()
    wait_until_listening("127.0.0.1", free_port(), timeout_s=0.2)  # nobody: returns, the store then fails
    assert time.monotonic() - t0 < 5
