"""Realistic dashboard fixtures written with the ORM: passing, regressed, errored and queued runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from models import Environment, Phase, ProbeFinding, Run, RunEvent, StepMetric

NOW = datetime.now(UTC).replace(microsecond=0)
STEPS, SAVE = 20, 10
XSS = "<script>window.__xss = 1</script>"
TRACEBACK = """\
[rank0] step 9 loss 4.1031
[rank0] saving checkpoint at step 10 (dp_reshardable)
Traceback (most recent call last):
  File "/opt/mcore/megatron/core/optimizer/distrib_optimizer.py", line 1187, in sharded_param_state_dp_reshardable
    assert param_range.size == tensors["param"].numel()
AssertionError: shard size mismatch for decoder.layers.0.mlp.router.weight
"""


@dataclass
class Seeded:
    """Ids the tests look for."""

    good: int
    regressed: int
    errored: int
    dense: int
    queued: int
    xss: int
    regressed_phase: int
    errored_phase: int
    total_runs: int


def spec(config: str = "moe-fp32-router", **extra: Any) -> dict[str, Any]:
    """A stored spec as RunSpec.to_dict() writes it."""
    out = {"config": config, "dp": 2, "steps": STEPS, "save_step": SAVE, "sharding": "dp_reshardable",
           "seed": 1234, "tolerance": "default", "workarounds": [], "isolation": "process"}
    return {**out, **extra}


def summary(mcore: str, **extra: Any) -> dict[str, Any]:
    """A run summary with the versions its phases recorded."""
    info = {"torch": "2.13.0", "megatron_core": mcore, "python": "3.11.9", "device": "cpu", "backend": "gloo",
            "world_size": 2}
    return {"phases": {"train_and_save": {"status": "ok", "info": info}, "resume": {"status": "ok", "info": info}},
            **extra}


def metrics(run_id: int, *, diverge_from: int | None = None, lr_off: tuple[int, ...] = ()) -> list[dict]:
    """STEPS metric rows; the resumed run drifts from diverge_from on and mis-steps lr at lr_off."""
    rows = []
    for step in range(1, STEPS + 1):
        loss = 4.6 * math.exp(-step / 25) + 0.01 * math.sin(step)
        lr = 1e-3 * min(1.0, step / 5)
        resumed = lr_res = None
        if step > SAVE:
            drift = 3e-5 * 2 ** (step - diverge_from) if diverge_from and step >= diverge_from else 0.0
            resumed, lr_res = loss + drift, lr * (1.5 if step in lr_off else 1.0)
        delta = None if resumed is None else resumed - loss
        rows.append({"run_id": run_id, "step": step, "loss_baseline": loss, "loss_resumed": resumed,
                     "lr_baseline": lr, "lr_resumed": lr_res, "loss_abs_delta": delta,
                     "loss_rel_delta": None if delta is None else abs(delta) / loss,
                     "within_tolerance": None if delta is None else abs(delta) <= 1e-5 * loss})
    return rows


def write_logs(run_folder: Path, run_id: int, name: str, job_id: str, stderr: str) -> tuple[str, list[str]]:
    """Create a phase folder with submitit-style stdout/stderr files; -> (folder, log paths)."""
    folder = run_folder / f"run-{run_id}" / f"{name}-attempt1"
    folder.mkdir(parents=True, exist_ok=True)
    out, err = folder / f"{job_id}_0_log.out", folder / f"{job_id}_0_log.err"
    out.write_text("".join(f"[rank0] step {s} loss {4.6 * math.exp(-s / 25):.4f}\n" for s in range(1, 11)))
    err.write_text(stderr)
    return str(folder), [str(out), str(err)]


def _run(session: Session, env: Environment, *, age_h: float, **fields: Any) -> Run:
    created = NOW - timedelta(hours=age_h)
    defaults: dict[str, Any] = {"config": "moe-fp32-router", "state": "passed", "verdict": "pass",
                                "labels": {"branch": "main"}, "signatures": [], "summary": summary("0.16.1")}
    values = {**defaults, **fields}
    values.setdefault("spec", spec(values["config"]))
    run = Run(environment_id=env.id, created_at=created, updated_at=created,
              finished_at=None if values["state"] == "queued" else created + timedelta(minutes=4), **values)
    session.add(run)
    session.flush()
    session.add_all([RunEvent(run_id=run.id, from_state=None, to_state="queued", reason="queued by API", at=created),
                     RunEvent(run_id=run.id, from_state="queued", to_state="train_submitted",
                              reason="slurm job 101 submitted", at=created + timedelta(seconds=5))])
    if values["state"] != "queued":
        session.add(RunEvent(run_id=run.id, from_state="evaluating", to_state=values["state"],
                             reason=f"verdict {values['verdict']}", at=created + timedelta(minutes=4)))
    return run


def _phase(session: Session, run: Run, run_folder: Path, name: str, state: str, job_id: str, stderr: str) -> Phase:
    folder, paths = write_logs(run_folder, run.id, name, job_id, stderr)
    start = run.created_at + timedelta(seconds=10)
    phase = Phase(run_id=run.id, name=name, attempt=1, state=state, executor="slurm", job_id=job_id, folder=folder,
                  submitted_at=start, started_at=start, ended_at=start + timedelta(seconds=95), duration_s=95.0,
                  save_s=3.2 if name == "train_and_save" else None, load_s=2.1 if name == "resume" else None,
                  info={}, log_paths=paths, exit_reason=None if state == "succeeded" else "save: AssertionError")
    session.add(phase)
    session.flush()
    return phase


def seed(session: Session, run_folder: Path) -> Seeded:
    """Write the dashboard's test world; the caller commits."""
    env = Environment(name="default", python="/usr/bin/python3", description="CI image",
                      packages={"torch": "2.13.0", "megatron-core": "0.16.1"})
    main = Environment(name="mcore-main", python="/opt/mcore-main/bin/python", description="Megatron-LM main",
                       packages={"torch": "2.13.0", "megatron-core": "0.17.0rc0"})
    session.add_all([env, main])
    session.flush()
    # first, good and regressed are one check (same spec) on one track (main)
    same = spec(sharding="fully_reshardable")
    first = _run(session, env, age_h=50, labels={"branch": "main", "commit": "aaa111"}, max_abs_loss_delta=0.0,
                 spec=same)
    good = _run(session, env, age_h=26, labels={"branch": "main", "commit": "bbb222"}, max_abs_loss_delta=0.0,
                summary=summary("0.16.0"), spec=same)
    regressed = _run(
        session, env, age_h=2, state="failed", verdict="fail", regression=True, last_good_run_id=good.id,
        labels={"branch": "main", "commit": "ccc333"}, spec=same,
        signatures=["optimizer-index-misalignment", "lr-schedule-mismatch"], first_divergent_step=11,
        first_step_beyond_tolerance=13, max_abs_loss_delta=3e-5 * 2 ** 9,
        summary=summary("0.16.1", advisories=["bucket-offset-unaligned"],
                        evidence={"optimizer-index-misalignment": {"misaligned_total": 2}}),
    )
    regressed.failing_since_run_id = regressed.id
    errored = _run(session, main, age_h=1, config="moe-fp32-router", state="error", verdict="error",
                   signatures=["checkpoint-save-crash"], error_message="AssertionError: shard size mismatch",
                   summary=summary("0.17.0rc0", errors=[{"stage": "save", "type": "AssertionError",
                                                         "message": "shard size mismatch"}]))
    errored.failing_since_run_id = errored.id
    dense = _run(session, env, age_h=5, config="dense-bf16", max_abs_loss_delta=0.0,
                 summary=summary("0.16.1", verdict_label="pass (worked around)",
                                 worked_around_by={"restore-adam-step": ["adam-step-not-restored"]}))
    xss = _run(session, main, age_h=3, config="dense-bf16", labels={"branch": XSS}, max_abs_loss_delta=0.0)
    queued = _run(session, env, age_h=0.1, state="queued", verdict=None, labels={"branch": "feature"})
    for run in (first, good, dense, xss):
        session.execute(insert(StepMetric), metrics(run.id))
    session.execute(insert(StepMetric), metrics(regressed.id, diverge_from=11, lr_off=(11, 12)))
    for run in (first, good, dense, xss):
        _phase(session, run, run_folder, "train_and_save", "succeeded", f"{run.id}01", "")
        _phase(session, run, run_folder, "resume", "succeeded", f"{run.id}02", "")
    _phase(session, regressed, run_folder, "train_and_save", "succeeded", "9101", "")
    regressed_phase = _phase(session, regressed, run_folder, "resume", "succeeded", "9102",
                             "[rank0] loaded checkpoint step 10\nWARNING: lr differs at step 11\n")
    errored_phase = _phase(session, errored, run_folder, "train_and_save", "failed", "9201", TRACEBACK)
    findings = [
        ProbeFinding(run_id=regressed.id, phase="train_and_save", probe="index_map", ok=False, param_name=None,
                     detail={"misaligned_total": 2, "raw_misaligned_total": 2}),
        ProbeFinding(run_id=regressed.id, phase="train_and_save", probe="index_map", ok=False,
                     param_name="decoder.layers.0.mlp.router.weight",
                     detail={"rank": 0, "dtype": "float32", "group": 0, "index": 3, "expected_index": 0,
                             "expected_numel": 512, "installed_numel": 4096,
                             "installed_param": "decoder.layers.0.self_attention.linear_qkv.weight"}),
        ProbeFinding(run_id=regressed.id, phase="train_and_save", probe="index_map", ok=False,
                     param_name="decoder.layers.1.mlp.router.weight",
                     detail={"rank": 1, "dtype": "float32", "group": 0, "index": 4, "expected_index": 1,
                             "expected_numel": 512, "installed_numel": 512,
                             "installed_param": "decoder.layers.1.mlp.experts.gate"}),
        ProbeFinding(run_id=regressed.id, phase="resume", probe="restored_state_fingerprints", ok=False,
                     param_name=None, detail={"differing": 2}),
        ProbeFinding(run_id=regressed.id, phase="resume", probe="restored_state_fingerprints", ok=False,
                     param_name="decoder.layers.0.mlp.router.weight",
                     detail={"rank": 0, "param": "decoder.layers.0.mlp.router.weight", "key": "exp_avg",
                             "before": {"numel": 512, "sum": 0.0123}, "after": {"numel": 512, "sum": -0.4410}}),
        ProbeFinding(run_id=regressed.id, phase="resume", probe="restored_state_fingerprints", ok=False,
                     param_name="decoder.layers.0.mlp.router.weight",
                     detail={"rank": 0, "param": "decoder.layers.0.mlp.router.weight", "key": "step",
                             "before": 10, "after": 1}),
    ]
    session.add_all(findings)
    session.flush()
    return Seeded(good=good.id, regressed=regressed.id, errored=errored.id, dense=dense.id, queued=queued.id,
                  xss=xss.id, regressed_phase=regressed_phase.id, errored_phase=errored_phase.id, total_runs=7)


def golden_run(session: Session, env: Environment, case: str) -> Run:
    """A finished run built through the real ingestion path from a golden case's phase documents."""
    from jobs.verdict.compare import evaluate
    from service.runs.evaluation import store_result
    from service.runs.phase_documents import validate_phase_document
    from tests.golden import documents, expected

    docs = {name: validate_phase_document(doc) for name, doc in documents(case).items()}
    verdict_state = {"pass": "passed", "fail": "failed", "error": "error"}
    result = evaluate(expected(case)["spec"], docs.get("train_and_save"), docs.get("resume"))
    run = _run(session, env, age_h=0.5, state=verdict_state[result["verdict"]], verdict=result["verdict"],
               spec=expected(case)["spec"], labels={"branch": f"golden-{case}"}, summary={})
    for name, doc in docs.items():
        session.add(Phase(run_id=run.id, name=name, attempt=1, state="succeeded" if doc["status"] == "ok" else "failed",
                          executor="local", job_id=f"{run.id}{name[:2]}", folder=None, info=dict(doc), log_paths=[]))
    store_result(session, run, result)
    session.flush()
    return run
