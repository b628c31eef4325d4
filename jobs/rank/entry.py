"""The job payload: one phase of a parity run on one rank (a submitit task).

Phases: `train_and_save` (steps 1..M uninterrupted, checkpoint at N on the way), `resume`
(fresh processes load step N and run N+1..M) and `uninterrupted` (steps 1..M, no checkpoint; the
benchmark's uninterrupted launch). Arguments are plain data; the return value is a JSON-ready
document. Keep the module importable without torch: the service pickles a reference to it.
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any, cast

from jobs.contract import PHASE_NAMES, PhaseDocument, PhaseName, exception_record, phase_document
from jobs.errors import with_rank_errors
from jobs.rank.context import PhaseAbort, RankContext, write_json
from jobs.run_folder import RunFolder
from jobs.spec import RunSpec, SpecError

COLLECTIVE_TIMEOUT_S = 90.0
STAGE_TIMEOUT_S = {"import": 180.0, "init": 120.0, "build": 120.0, "save": 180.0, "load": 180.0}
log = logging.getLogger("jobs.rank.entry")


def _env_rank() -> int:
    for key in ("SUBMITIT_LOCAL_GLOBALID", "SLURM_PROCID", "RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def _setup_logging(folder: Path, rank: int) -> None:
    handler = logging.FileHandler(folder / f"rank{rank}.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def _environment(info: Any) -> dict[str, Any]:
    import megatron.core
    import torch

    from jobs.rank import cpu_shim, dist

    return {
        "torch": torch.__version__,
        "megatron_core": megatron.core.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "device": info.device,
        "backend": info.backend,
        "world_size": info.world_size,
        "cpu_shims": cpu_shim.installed(),
        "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
        "multinode": dict(dist.MULTINODE),  # empty on a one-node job
    }


def _peak_memory() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    from jobs.rank import device

    if device.is_cuda():
        out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def run_rank_phase(
    spec: dict[str, Any], run_folder: str, phase: str, master_port: int | None = None,
    attempt: int = 1, checkpoint_attempt: int = 1,
) -> PhaseDocument:
    """Run one phase on this rank and return its result document (never raises).

    Logs, documents and (for train_and_save) the checkpoint go to this attempt's own folder
    (`jobs.run_folder`); resume loads the checkpoint of train_and_save attempt `checkpoint_attempt`.
    """
    t_start = time.time()
    rank = _env_rank()
    doc = phase_document(spec, cast(PhaseName, phase), rank)
    doc["node"] = socket.gethostname()  # which node this rank ran on (merged into the phase's rank_nodes)
    run_dir = RunFolder(Path(run_folder))
    folder = run_dir.attempt(phase, attempt).folder
    folder.mkdir(parents=True, exist_ok=True)
    _setup_logging(folder, rank)
    ctx = RankContext(folder, rank, doc)
    try:
        if phase not in PHASE_NAMES:
            raise SpecError("phase", f"unknown phase {phase!r}", list(PHASE_NAMES))
        run_spec = RunSpec.from_dict(spec)
        saver = run_dir.attempt("train_and_save", attempt if phase == "train_and_save" else checkpoint_attempt)
        _run(ctx, run_spec, phase, saver.checkpoint(run_spec.save_step), master_port)
        doc["status"] = "ok"
    except PhaseAbort as abort:
        doc["status"] = "error"
        doc["error"] = with_rank_errors(abort.errors[0], abort.errors)
    except Exception as exc:  # noqa: BLE001 - a phase returns a document, whatever happened
        doc["status"] = "error"
        doc["error"] = exception_record(exc, ctx.stage, rank)
    doc["info"]["wall_seconds"] = round(time.time() - t_start, 4)
    try:
        doc["info"]["peak_memory"] = _peak_memory()
    except Exception:  # noqa: BLE001 - torch may have failed to import
        pass
    _shutdown(ctx)
    doc["info"]["fast_exit"] = arm_fast_exit()
    write_json(ctx.result_path, doc)
    return doc


def arm_fast_exit() -> bool:
    """Under submitit, skip interpreter teardown once the task has written its result.

    Tearing down torch + Megatron module state takes ~1 s per process and does nothing the OS
    does not do at exit. The handler is registered last, so it runs first at exit, after
    submitit has pickled the result; it never applies in-process (tests, torchrun).
    PARITY_FAST_EXIT=0 turns it off.
    """
    from jobs.rank.dist import under_submitit

    if not under_submitit() or os.environ.get("PARITY_FAST_EXIT", "1") != "1":
        return False

    def fast_exit() -> None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    atexit.register(fast_exit)
    return True


def _shutdown(ctx: RankContext) -> None:
    if ctx.distributed:
        from jobs.rank import dist

        dist.shutdown()
    from jobs.rank import cpu_shim, device

    cpu_shim.uninstall()
    device.reset()


def _run(ctx: RankContext, spec: RunSpec, phase: str, ckpt: Path, master_port: int | None) -> None:
    from jobs.rank import dist

    def imports() -> None:
        from jobs.rank import device

        # before anything here touches CUDA: a cpu rank hides the GPUs, a cuda one sets the deterministic knobs
        changed = device.prepare_environment(spec.device)
        if spec.device == "cuda":  # a cpu document stays as it was
            ctx.doc["info"]["device_environment"] = changed
        # torch first, so rank 0's rendezvous server is listening while everyone imports Megatron.
        dist.start_rendezvous(master_port, COLLECTIVE_TIMEOUT_S)
        from jobs.rank import cpu_shim

        if spec.device == "cpu":  # a cuda rank runs Megatron's own CUDA calls
            cpu_shim.install()
        import megatron.core  # noqa: F401 - import cost is part of what the stage measures

    ctx.run("import", imports, STAGE_TIMEOUT_S["import"])
    from jobs.rank import mutants, training

    # Inside the phase body, so a forked child and a fresh interpreter inject alike.
    undo = mutants.install(spec.mutants, phase)
    try:
        _body(ctx, spec, phase, ckpt, master_port, training)
    finally:
        undo()


def _body(
    ctx: RankContext, spec: RunSpec, phase: str, ckpt: Path, master_port: int | None, training: Any
) -> None:
    from jobs.rank import dist

    doc = ctx.doc
    layout = spec.layout(phase)  # a resume on another layout runs its own sizes
    info = ctx.run(
        "init",
        lambda: dist.init(master_port, COLLECTIVE_TIMEOUT_S, tp=layout.tp, pp=layout.pp, ep=layout.ep,
                          device=spec.device, vpp=spec.virtual_pipeline_size(phase)),
        STAGE_TIMEOUT_S["init"],
    )
    ctx.distributed = True
    doc["info"].update(_environment(info))
    doc["info"]["layout"] = dist.layout()  # as Megatron built it (the spec omits sizes of 1)
    trainee = ctx.run("build", lambda: training.build(ctx, spec, phase), STAGE_TIMEOUT_S["build"], agree=True)
    first = 1
    if phase == "resume":
        training.load(ctx, trainee, spec, ckpt, STAGE_TIMEOUT_S["load"])
        first = trainee.iteration + 1  # the restored iteration drives the loop (checked to be N)
    save_at = spec.save_step if phase == "train_and_save" else None
    training.run_steps(ctx, trainee, spec, first, save_at, ckpt, STAGE_TIMEOUT_S["save"])


def _main(argv: list[str]) -> int:
    """Run a phase under torchrun: python -m jobs.rank.entry SPEC_JSON RUN_FOLDER PHASE."""
    import json

    os.environ["PARITY_FAST_EXIT"] = "0"  # the exit code below must survive
    doc = run_rank_phase(json.loads(argv[0]), argv[1], argv[2])
    return 0 if doc["status"] == "ok" else 1


if __name__ == "__main__":
    # The guard matters: dist_checkpointing starts a spawn-mode Manager that re-imports __main__.
    sys.exit(_main(sys.argv[1:]))
