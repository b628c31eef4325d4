"""The run page: one run's rows only (metrics, probes, phases, events) and its chart series."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from jobs.spec import RESHARD_TOLERANCE, RunSpec
from jobs.tolerance import TOLERANCE_PROFILES, ToleranceProfile, calibrated_reshard_profile
from jobs.verdict_names import FAILED
from models import ProbeFinding, Run, RunEvent, StepMetric
from service.web.dashboard.findings import fingerprint_summary
from service.web.dashboard.logs import link_path, listed_logs
from service.web.dashboard.rendering import PageError

METRIC_COLUMNS = (StepMetric.step, StepMetric.loss_baseline, StepMetric.loss_resumed, StepMetric.lr_baseline,
                  StepMetric.lr_resumed, StepMetric.loss_abs_delta, StepMetric.within_tolerance)


def load_run(session: Session, run_id: int, *, with_phases: bool = False) -> Run:
    """The run with its environment (and phases), or a 404 page."""
    query = select(Run).where(Run.id == run_id).options(selectinload(Run.environment))
    if with_phases:
        query = query.options(selectinload(Run.phases))
    run = session.scalar(query)
    if run is None:
        raise PageError(404, f"run {run_id} does not exist")
    return run


def tolerance_of(run: Run) -> ToleranceProfile | None:
    """The tolerance profile the run was judged with (`reshard` for a resharded resume left at exact)."""
    name = str(run.spec.get("tolerance", ""))
    if run.spec.get("resume_dp") is not None and name in ("exact", ""):
        spec = run.spec  # judged by the bounds measured for its config and direction, where there are some
        try:  # on the config's training as it is now (a run stored before it changed: the static band)
            training: str | None = RunSpec.from_dict(spec).training
        except (ValueError, TypeError, KeyError):
            return TOLERANCE_PROFILES.get(RESHARD_TOLERANCE)
        measured, _ = calibrated_reshard_profile(str(spec["config"]), int(spec["dp"]), int(spec["resume_dp"]),
                                                 int(spec["steps"]) - int(spec["save_step"]), training=training)
        return measured or TOLERANCE_PROFILES.get(RESHARD_TOLERANCE)
    return TOLERANCE_PROFILES.get(name)


@dataclass
class Step:
    """One row of the per-step table."""

    step: int
    loss_baseline: float | None
    loss_resumed: float | None
    lr_baseline: float | None
    lr_resumed: float | None
    abs_delta: float | None
    within_tolerance: bool | None

    @property
    def lr_mismatch(self) -> bool:
        """Both runs recorded an lr at this step and they differ (exactly, as the verdict checks)."""
        return None not in (self.lr_baseline, self.lr_resumed) and self.lr_baseline != self.lr_resumed


def steps_of(session: Session, run_id: int) -> list[Step]:
    """The run's metric rows in step order (primary-key range scan)."""
    rows = session.execute(select(*METRIC_COLUMNS).where(StepMetric.run_id == run_id).order_by(StepMetric.step))
    return [Step(r.step, r.loss_baseline, r.loss_resumed, r.lr_baseline, r.lr_resumed,
                 None if r.loss_abs_delta is None else abs(r.loss_abs_delta), r.within_tolerance) for r in rows]


def log_floor(values: list[float | None]) -> float:
    """A power of ten standing in for exact zero on a log axis, a decade or more below every nonzero value."""
    nonzero = [v for v in values if v]
    exponent = min(-12, math.floor(math.log10(min(nonzero))) - 1) if nonzero else -12
    return float(10.0**exponent)


def chart_data(run: Run, steps: list[Step]) -> dict[str, Any]:
    """Series for the loss, |Δloss| and lr charts, and the step markers, as plain JSON data."""
    profile = tolerance_of(run)
    save_step = int(run.spec.get("save_step", 0))
    deltas = [s.abs_delta for s in steps]
    floor = log_floor(deltas)
    tolerance: list[float | None] = []
    for s in steps:
        band = None
        if profile and s.step > save_step and s.loss_baseline is not None:
            band = profile.loss_atol + profile.loss_rtol * abs(s.loss_baseline)
        tolerance.append(band or None)
    markers = [{"step": save_step, "label": f"save @ {save_step}", "kind": "save"}]
    if run.first_divergent_step is not None:
        markers.append({"step": run.first_divergent_step, "label": f"first divergent @ {run.first_divergent_step}",
                        "kind": "diverge"})
    beyond = run.first_step_beyond_tolerance
    delta_markers = list(markers)
    if beyond is not None and beyond != run.first_divergent_step:
        delta_markers.append({"step": beyond, "label": f"beyond tolerance @ {beyond}", "kind": "beyond"})
    # a lane carries a divergence marker only where that lane diverged: the lr chart marks its own mismatch
    lr_markers = list(markers[:1])
    first_lr = next((s.step for s in steps if s.lr_mismatch), None)
    if first_lr is not None:
        lr_markers.append({"step": first_lr, "label": f"lr differs @ {first_lr}", "kind": "diverge"})
    return {
        "delta_markers": delta_markers,
        "lr_markers": lr_markers,
        "exact": not any(tolerance),
        "steps": [s.step for s in steps],
        "loss_baseline": [s.loss_baseline for s in steps],
        "loss_resumed": [s.loss_resumed for s in steps],
        # exact zeros sit on the floor so a bit-exact run still shows a line on the log axis
        "abs_delta": [None if d is None else (d or floor) for d in deltas],
        "tolerance": tolerance,
        "floor": floor,
        "lr_baseline": [s.lr_baseline for s in steps],
        "lr_resumed": [s.lr_resumed for s in steps],
        "lr_mismatch": [s.lr_resumed if s.lr_mismatch else None for s in steps],
        "markers": markers,
    }


def probe_sections(session: Session, run_id: int) -> dict[str, Any]:
    """Probe findings split into summaries, misaligned params and fingerprint differences by param."""
    findings = list(session.scalars(select(ProbeFinding).where(ProbeFinding.run_id == run_id)
                                    .order_by(ProbeFinding.id)))
    summaries = [f for f in findings if f.param_name is None]
    misaligned = [f for f in findings if f.param_name and f.probe == "index_map"]
    fingerprints: dict[str, list[ProbeFinding]] = {}
    for f in findings:
        if f.param_name and f.probe.endswith("fingerprints"):
            fingerprints.setdefault(f.param_name, []).append(f)
    others = [f for f in findings if f.param_name and f.probe != "index_map" and not f.probe.endswith("fingerprints")]
    flat = [{"param": param, **(f.detail or {})} for param, found in fingerprints.items() for f in found]
    return {"summaries": summaries, "misaligned": misaligned, "fingerprints": fingerprints, "others": others,
            "fingerprint_sentences": fingerprint_summary(flat), "fingerprint_rows": len(flat)}


def events_of(session: Session, run_id: int) -> list[RunEvent]:
    """The run's state transitions in order."""
    return list(session.scalars(select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.at, RunEvent.id)))


def log_links(run: Run, run_folder: Path) -> dict[int, list[dict[str, str]]]:
    """Per phase id: log links (label and path relative to the run folder), live phases included."""
    out: dict[int, list[dict[str, str]]] = {}
    for phase in run.phases:
        out[phase.id] = [{"name": Path(p).name, "path": link_path(p, run_folder)} for p in listed_logs(phase)]
    return out


def run_page(session: Session, run_id: int, run_folder: Path) -> dict[str, Any]:
    """Everything the run page shows."""
    run = load_run(session, run_id, with_phases=True)
    steps = steps_of(session, run_id)
    save_step = int(run.spec.get("save_step", 0))
    return {
        "run": run,
        "resume_ran": any(s.loss_resumed is not None for s in steps),
        "steps": steps,
        "resumed_steps": [s for s in steps if s.step > save_step],
        "lr_mismatches": sum(s.lr_mismatch for s in steps),
        "charts": chart_data(run, steps),
        "tolerance": tolerance_of(run),
        "probes": probe_sections(session, run_id),
        "events": events_of(session, run_id),
        "logs": log_links(run, run_folder),
        "failed": run.verdict in FAILED or run.state in ("failed", "error"),
    }
