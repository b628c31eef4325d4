"""Rendezvous ports: derived alike on every rank, clear of the kernel's ephemeral ports."""

from __future__ import annotations


def test_job_master_port_is_shared_and_below_the_ephemeral_range() -> None:
    from jobs.rank.dist import LOWEST_MASTER_PORT, _ephemeral_floor, job_master_port

    ports = {job_master_port(str(job_id)) for job_id in range(1000, 1100)}
    assert len(ports) == 100  # consecutive jobs never share a port
    assert all(LOWEST_MASTER_PORT <= p < _ephemeral_floor() for p in ports)
    assert job_master_port("4242") == job_master_port("4242")
