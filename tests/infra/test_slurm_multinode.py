"""The two-node Slurm (scripts/slurm-multinode-up.sh) and a gloo rendezvous across its nodes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]  # past the 300 s ceiling: real builds or many runs
# Jobs unpickle these functions in a fresh interpreter where this test module is not importable.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rendezvous() -> dict[str, Any]:
    """One rank: export the env as a parity phase does, join a gloo group, gather every rank's host."""
    import datetime
    import os
    import socket

    import torch

    from jobs.rank import dist

    submitit_master = submitit.helpers.TorchDistributedEnvironment().master_addr
    dist.export_env(None)
    try:
        socket.getaddrinfo(submitit_master, None)
        resolves = True
    except OSError:
        resolves = False
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        hosts: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(hosts, socket.gethostname())
        total = torch.tensor([float(torch.distributed.get_rank() + 1)])
        torch.distributed.all_reduce(total)
    finally:
        torch.distributed.destroy_process_group()
    return {
        "rank": int(os.environ["RANK"]),
        "host": socket.gethostname(),
        "submitit_master": submitit_master,
        "submitit_master_resolves": resolves,
        "MASTER_ADDR": os.environ["MASTER_ADDR"],
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME"),
        "multinode": dict(dist.MULTINODE),
        "hosts": hosts,
        "sum": float(total.item()),
    }


@pytest.mark.nightly
def test_two_nodes_each_with_its_own_hostname_and_address(on_two_nodes: str) -> None:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert sorted(line.split()[0] for line in out.stdout.splitlines()) == ["pnode1", "pnode2"]
    addrs = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=30).stdout
    assert "NodeAddr=10.77.0.11" in addrs and "NodeAddr=10.77.0.12" in addrs
    # the shared single-node cluster is another cluster: this one has its own name
    conf = Path(on_two_nodes).read_text()
    assert "ClusterName=parity2" in conf


@pytest.mark.nightly
def test_second_start_is_a_no_op(on_two_nodes: str, repo_root: Path) -> None:
    run = Path(on_two_nodes).parent.parent / "run"
    before = {p.name: p.read_text() for p in run.glob("*.pid")}
    out = subprocess.run(
        [str(repo_root / "scripts" / "slurm-multinode-up.sh"), "--nodes", "2"],
        env={**os.environ, "PARITY_SLURM2_DIR": str(run.parent), "PARITY_SLURM_NO_APT": "1"},
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for daemon in ("slurmctld", "slurmd pnode1", "slurmd pnode2"):
        assert f"{daemon} already running" in out.stdout, out.stdout
    assert "READY" in out.stdout
    assert {p.name: p.read_text() for p in run.glob("*.pid")} == before, "a second start restarted a daemon"


@pytest.mark.nightly
def test_gloo_rendezvous_spans_both_nodes(on_two_nodes: str, tmp_path: Path) -> None:
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(nodes=2, tasks_per_node=1, cpus_per_task=1, timeout_min=5)
    job = executor.submit(rendezvous)
    results = sorted(job.results(), key=lambda r: r["rank"])

    assert [r["host"] for r in results] == ["pnode1", "pnode2"]
    assert all(r["hosts"] == ["pnode1", "pnode2"] for r in results)
    assert all(r["sum"] == 3.0 for r in results)
    # submitit names the first node by hostname, which the other node cannot resolve: the rendezvous
    # must dial Slurm's NodeAddr of it instead, and gloo must bind to the node's own interface
    assert {r["submitit_master"] for r in results} == {"pnode1"}
    assert results[1]["submitit_master_resolves"] is False
    assert {r["MASTER_ADDR"] for r in results} == {"10.77.0.11"}
    assert {r["GLOO_SOCKET_IFNAME"] for r in results} == {"eth0"}
    assert results[0]["multinode"] == {
        "master_node": "pnode1", "master_addr": "10.77.0.11", "gloo_socket_ifname": "eth0",
    }
