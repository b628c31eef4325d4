"""Isolation "process": one job runs a whole attempt; each task forks a fresh child per phase.

The task's parent process only imports torch, Megatron-Core and the jobs package: no CUDA
initialisation, no process group, no model, no threads. It then forks a child for
`train_and_save`, waits for it, and forks another child for `resume`. Each child sets up its own
process group on its own rendezvous port, writes its rank document and leaves with `os._exit`,
so the resume child inherits nothing from the saving child: only the checkpoint on disk joins
them. The imports (~3.5 s of a ~5.5 s launch on 2 cores) are paid once per attempt instead of
once per phase, and a Slurm attempt is one allocation instead of two queue waits.

A child that dies without a document (a crash outside the phase's own error handling, a signal)
is reported by its parent with the child's own traceback; peers see the crash through their
broken collectives, and every parent waits for all ranks' documents before deciding, as one, to
resume or to stop.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, cast

from jobs.contract import PhaseDocument, PhaseName, error_record, phase_document
from jobs.rank.context import write_json
from jobs.rank.dist import job_master_port
from jobs.rank.entry import _env_rank, arm_fast_exit, run_rank_phase
from jobs.run_folder import RunFolder
from jobs.spec import RunSpec

# Everything a phase imports lazily that is slow to import; pre-importing is pure module loading.
PRELOAD = (
    "torch",
    "megatron.core",
    "megatron.core.parallel_state",
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.transformer",
    "megatron.core.transformer.module",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.tensor_parallel.random",
    "megatron.core.distributed",
    "megatron.core.optimizer",
    "megatron.core.optimizer.layer_wise_optimizer",
    "megatron.core.optimizer_param_scheduler",
    "megatron.core.process_groups_config",
    "megatron.core.dist_checkpointing",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "jobs.rank.cpu_shim",
    "jobs.rank.training",
)
PHASES = ("train_and_save", "resume")
# torch.cuda.is_available() / device_count() answer from NVML instead of cudaGetDeviceCount, which
# initialises the CUDA driver and poisons fork: every phase child on a GPU would then fail with "Cannot
# re-initialize CUDA in forked subprocess" (seen on an H200 with torch 2.11). Read at each call.
NVML_CHECK = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
PEER_WAIT_S = 900.0
POLL_S = 0.02


def preload() -> dict[str, Any]:
    """Import every slow module once, in this (parent) process; never raises.

    A module that fails to import here fails again, with the phase's own error document, in the
    child's "import" stage, so the failure reads the same as under isolation "job".
    """
    t0 = time.perf_counter()
    # Fork safety: this process forks the phase children, which alone may initialise CUDA (a cuda rank
    # binds its GPU in jobs/rank/device.bind, after the fork); an import that only asks whether CUDA
    # exists must not initialise it here (tests/jobs/test_fork_safety_megatron.py).
    os.environ.update(NVML_CHECK)
    failed = {}
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported by the child's import stage
            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
    return {
        "preload_seconds": round(time.perf_counter() - t0, 4),
        "preload_failed": failed,
        # fork() copies only the calling thread: a second thread here would be a lock left held.
        "threads_at_fork": threading.active_count(),
        "cuda_initialized_at_fork": _cuda_initialized(),
    }


def _cuda_initialized() -> bool:
    """Whether CUDA is initialised in this process (asked without initialising it; False without torch)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch that failed to import has no CUDA state
        return False


def run_attempt(
    spec: dict[str, Any], run_folder: str, phases: tuple[str, ...] = PHASES, master_ports: list[int] | None = None,
    attempts: dict[str, int] | None = None, checkpoint_attempt: int = 1,
) -> dict[str, Any]:
    """The submitit payload under isolation "process": this rank's documents of every phase run.

    `attempts` names each phase's attempt (its folder, `jobs.run_folder`; 1 when absent); resume loads
    the checkpoint of train_and_save attempt `checkpoint_attempt` (the one this job saved, if it ran).
    """
    attempts = attempts or {}
    if "train_and_save" in phases:
        checkpoint_attempt = attempts.get("train_and_save", 1)
    # every rank of the phases' layout (dp * tp * pp; phases that run in one job share it)
    rank, world = _env_rank(), RunSpec.from_dict(spec).phase_world_size(phases[0])
    info = preload()
    out: dict[str, Any] = {"isolation": "process", "rank": rank, "phases": {}, "info": info}
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
    for index, phase in enumerate(phases):
        # a warm worker's orders share its job id: the scheduler gives each order ports of its own
        # (service/runs/pool_dispatch.py); a cold job derives them from its id
        port = master_ports[index] if master_ports else job_master_port(job_id, index)
        t0 = time.perf_counter()
        attempt = attempts.get(phase, 1)
        doc = run_child(spec, run_folder, phase, port, rank, attempt, checkpoint_attempt)
        doc["info"]["child_wall_seconds"] = round(time.perf_counter() - t0, 4)
        doc["info"]["isolation"] = "process"
        out["phases"][phase] = doc
        # every rank takes the same decision from the same documents, so no rank waits alone
        peers = wait_for_peers(RunFolder(Path(run_folder)).attempt(phase, attempt).folder, world, PEER_WAIT_S)
        if index + 1 < len(phases) and not all(d.get("status") == "ok" for d in peers):
            break
    arm_fast_exit()  # the parent skips its teardown too, once its result is pickled
    return out


def run_child(
    spec: dict[str, Any], run_folder: str, phase: str, port: int, rank: int, attempt: int = 1,
    checkpoint_attempt: int = 1,
) -> PhaseDocument:
    """Fork a fresh child that runs one phase on this rank; return its document (never raises)."""
    folder = RunFolder(Path(run_folder)).attempt(phase, attempt).folder
    folder.mkdir(parents=True, exist_ok=True)
    crash_path = folder / f"crash.rank{rank}.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run the phase, then leave without running the parent's exit handlers
        code = 0
        try:
            run_rank_phase(spec, run_folder, phase, port, attempt, checkpoint_attempt)
        except BaseException:  # noqa: BLE001 - a crash the phase did not turn into a document
            code = 1
            crash_path.write_text(traceback.format_exc())
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    result_path = folder / f"result.rank{rank}.json"
    if result_path.exists():
        return cast(PhaseDocument, json.loads(result_path.read_text()))
    doc = crashed_doc(spec, phase, rank, status, crash_path)
    write_json(result_path, doc)  # peers and the scheduler read the rank files: leave one
    return doc


def crashed_doc(spec: dict[str, Any], phase: str, rank: int, status: int, crash_path: Path) -> PhaseDocument:
    """The document of a child that died without writing one: its exit and its own traceback."""
    if os.WIFSIGNALED(status):
        how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        how = f"exited with code {os.waitstatus_to_exitcode(status)}"
    tb = crash_path.read_text() if crash_path.exists() else ""
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    message = f"rank {rank}'s {phase} child {how} without a result" + (f": {last}" if last else "")
    # stage "job": the process running the phase died, whichever stage it was in
    error = error_record("ChildCrashed", message, stage="job", rank=rank, traceback=tb)
    doc = phase_document(spec, cast(PhaseName, phase), rank, status="error", error=error)
    doc["info"]["isolation"] = "process"
    return doc


def wait_for_peers(folder: Path, world: int, timeout_s: float) -> list[dict[str, Any]]:
    """Every rank's document of a phase, once all exist (a missing one after timeout_s counts as failed)."""
    deadline = time.monotonic() + timeout_s
    paths = [folder / f"result.rank{r}.json" for r in range(world)]
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return [json.loads(p.read_text()) if p.exists() else {"status": "error"} for p in paths]
