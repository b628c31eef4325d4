"""Rendezvous ports (derived alike on every rank, clear of the kernel's ephemeral ports) and CPU threads."""

from __future__ import annotations

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
