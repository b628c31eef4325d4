"""Process-group setup for one rank: submitit env export, gloo/nccl, Megatron parallel state."""

from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from jobs.rank.listeners import ports_listened_on_by_others
from jobs.rank.multinode import job_nodes


@dataclass(frozen=True)
class DistInfo:
    """Where this rank sits in the job."""

    rank: int
    world_size: int
    backend: str
    device: str


def free_port() -> int:
    """Return a TCP port that is free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LOWEST_MASTER_PORT = 20_000


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


# Rendezvous ports a job may use: one per phase child under isolation "process".
PORTS_PER_JOB = 2
# Blocks stepped over when a derived port is held by another user's listener (a broker, a database,
# another tenant's job): a prime, far from the neighbouring job ids' blocks that concurrent jobs hold.
SKIP_STRIDE_BLOCKS = 1009


def job_master_port(job_id: str, index: int = 0) -> int:
    """A rendezvous port every rank of a job derives alike, below the kernel's ephemeral range.

    submitit draws one from 20000-60000, which overlaps the ports the kernel hands to outgoing
    connections (32768-60999 here): a busy host then fails rank 0 with EADDRINUSE now and then.
    Consecutive job ids get disjoint blocks of PORTS_PER_JOB ports (`index` picks one: a forked
    phase child's own process group), so concurrent jobs on one node do not collide.

    A port another user's process listens on is stepped over (RabbitMQ's 25672 failed a nightly
    job with EADDRINUSE): every rank of a one-node job reads the same socket table, and this job's
    own listener (rank 0's store) never counts. Ranks on several nodes cannot see the master
    node's table alike, so a multi-node job keeps its first pick.
    """
    blocks = max(1, (_ephemeral_floor() - LOWEST_MASTER_PORT) // PORTS_PER_JOB)
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    first = int(digits) % blocks
    held = ports_listened_on_by_others() if job_nodes() == 1 else frozenset()
    for step in range(blocks):
        block = (first + step * SKIP_STRIDE_BLOCKS) % blocks
        port = LOWEST_MASTER_PORT + block * PORTS_PER_JOB + index % PORTS_PER_JOB
        if port not in held:
            return port
    return LOWEST_MASTER_PORT + first * PORTS_PER_JOB + index % PORTS_PER_JOB


def under_submitit() -> bool:
    """Return True inside a submitit task (local or Slurm)."""
    return any(k in os.environ for k in ("SUBMITIT_LOCAL_JOB_ID", "SUBMITIT_EXECUTOR", "SLURM_JOB_ID"))


# What export_env set up for a job spanning nodes (master node and address, gloo interface).
MULTINODE: dict[str, str] = {}


def export_env(master_port: int | None) -> None:
    """Set MASTER_ADDR/PORT, RANK, WORLD_SIZE for env:// init from submitit (or a 1-rank default)."""
    if master_port is not None:
        # submitit's helper reads MASTER_PORT back from the environment when it is set.
        os.environ["MASTER_PORT"] = str(master_port)
    elif under_submitit() and "MASTER_PORT" not in os.environ:
        job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or "0"
        os.environ["MASTER_PORT"] = str(job_master_port(job_id))
    if under_submitit():
        from submitit.helpers import TorchDistributedEnvironment

        env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        if "SUBMITIT_LOCAL_JOB_ID" in os.environ:
            # Local tasks share this host; loopback avoids hostname resolution surprises.
            os.environ["MASTER_ADDR"] = "127.0.0.1"
        else:
            # multi-node: the first node's address, never loopback, and an interface peers can reach
            from jobs.rank.multinode import export_multinode_env

            MULTINODE.clear()
            MULTINODE.update(export_multinode_env())
        del env
    elif "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))


_store: Any = None


def _tcp_store(*, is_master: bool, timeout_s: float) -> Any:
    """The job's TCPStore at MASTER_ADDR:MASTER_PORT (served by rank 0, joined by the others)."""
    import torch

    return torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=is_master,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def cpu_threads(local_ranks: int) -> int:
    """Intra-op threads for one CPU rank: its share of the cores it may run on, at most its Slurm CPUs.

    Ranks share the host's cores; oversubscribed intra-op threads only slow everyone down. Slurm's
    allocation counts too: a task given one CPU (SLURM_CPUS_PER_TASK) on a node whose other CPUs
    hold other jobs must not spread over the whole host (without CPU binding it could).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    share = max(1, cpus // max(1, local_ranks))
    given = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return min(share, int(given)) if given.isdigit() and int(given) >= 1 else share


def start_rendezvous(master_port: int | None, timeout_s: float) -> None:
    """Export the env and, on rank 0, start the TCPStore server now (before the slow imports).

    With env:// init, rank 0 only starts listening inside init_process_group; a peer that gets
    there first is refused and retries with backoff, which cost 0.5-0.8 s per launch here.
    """
    global _store

    export_env(master_port)
    if int(os.environ["RANK"]) == 0 and _store is None:
        _store = _tcp_store(is_master=True, timeout_s=timeout_s)


LISTEN_POLL_S = 0.005


def wait_until_listening(host: str, port: int, timeout_s: float) -> None:
    """Return once rank 0's store accepts connections (or after `timeout_s`: the store's own connect then
    fails with torch's error).

    A TCPStore client that finds no listener retries with a backoff of its own: in a warm worker both
    ranks' phase children start within milliseconds, rank 1 usually asked first, and the backoff cost
    0.3-0.8 s of every phase's init (both ranks waited it out). A plain connect every 5 ms costs nothing.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(LISTEN_POLL_S)


def init(
    master_port: int | None, timeout_s: float, tp: int = 1, pp: int = 1, ep: int = 1, device: str = "cpu",
    vpp: int | None = None,
) -> DistInfo:
    """Initialise torch.distributed and Megatron's parallel state for the layout (dp = world / (tp * pp)).

    `device` is the spec's: cuda binds LOCAL_RANK's GPU and uses NCCL, cpu uses gloo whatever the host
    has (jobs/rank/device.py); never decided from what torch happens to see.
    """
    global _store
    import torch
    from megatron.core import parallel_state

    from jobs.rank import device as rank_device

    if _store is None and int(os.environ.get("RANK", "-1")) > 0:
        wait_until_listening(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_s)
        _store = _tcp_store(is_master=False, timeout_s=timeout_s)
    if _store is None:
        export_env(master_port)
    binding = rank_device.bind(device)  # the first CUDA call of the process, in the phase child
    backend = binding.backend
    if backend == "gloo":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        torch.set_num_threads(cpu_threads(local))
    if not torch.distributed.is_initialized():
        # A finite timeout turns a peer that died mid-collective into an exception, not a hang.
        timeout = datetime.timedelta(seconds=timeout_s)
        if _store is not None:
            torch.distributed.init_process_group(
                backend=backend,
                store=_store,
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
                timeout=timeout,
            )
        else:
            torch.distributed.init_process_group(backend=backend, timeout=timeout)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
        virtual_pipeline_model_parallel_size=vpp,  # model chunks per pipeline stage (interleaved 1F1B)
    )
    return DistInfo(
        rank=torch.distributed.get_rank(),
        world_size=torch.distributed.get_world_size(),
        backend=backend,
        device=binding.device,
    )


def layout() -> dict[str, int]:
    """The layout Megatron's parallel state actually built on this rank (sizes and this rank's ranks)."""
    from megatron.core import parallel_state as ps

    out = {
        "dp": ps.get_data_parallel_world_size(),
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
        "expert_dp": ps.get_expert_data_parallel_world_size(),
        "dp_rank": ps.get_data_parallel_rank(),
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "ep_rank": ps.get_expert_model_parallel_rank(),
    }
    chunks = ps.get_virtual_pipeline_model_parallel_world_size()
    if chunks:  # a virtual pipeline: model chunks per stage (left out otherwise, as before)
        out["vpp"] = chunks
    return out


def gather(value: Any) -> list[Any]:
    """All-gather one picklable object from every rank (a collective: every rank must call it)."""
    import torch

    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out


def shutdown() -> None:
    """Tear down Megatron's parallel state and the process group, ignoring a broken group."""
    import torch
    from megatron.core import parallel_state

    global _store
    try:
        parallel_state.destroy_model_parallel()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    except Exception:  # noqa: BLE001 - a peer may already be gone; nothing left to protect
        pass
    _store = None
