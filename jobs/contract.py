"""The typed contract between the ranks, the verdict and the service: names and documents, defined once.

Stdlib + typing_extensions only (a dependency of both torch and submitit): this module runs in a
bare environment Python. The documents stay plain JSON-ready dicts; these TypedDicts are what mypy
checks where they are built, and what the service validates (pydantic `TypeAdapter`) where it
ingests them. To add a field: add it as `NotRequired[...]` (old documents lack it) and bump the
document's schema version only when a reader must tell old from new.
"""

from __future__ import annotations

import traceback as tb
from typing import Any, Literal, NotRequired, get_args

# typing.TypedDict on Python < 3.12 cannot be validated by pydantic; typing_extensions' can.
from typing_extensions import TypedDict

from jobs.signature_names import SignatureId
from jobs.verdict_names import Verdict

# Schema versions. Documents written before versions existed are version 1 (no schema_version key).
# Phase documents of version 3 and later must carry the state snapshots (required_probes).
PHASE_SCHEMA_VERSION = 3
STATE_PROBES_SINCE = 3
RESULT_SCHEMA_VERSION = 2

# Phases: steps 1..M with the checkpoint at N; load N and run N+1..M; 1..M without a save (benchmark).
PhaseName = Literal["train_and_save", "resume", "uninterrupted"]
PHASE_NAMES: tuple[PhaseName, ...] = get_args(PhaseName)
PhaseStatus = Literal["running", "ok", "error"]

# Where a phase can fail. Rank stages first; then the launcher's, the service's and the verdict's own.
Stage = Literal[
    "start", "import", "init", "build", "probe", "load", "step", "save",
    "spec", "launch", "job", "ingest", "evaluate",
]
STAGES: tuple[Stage, ...] = get_args(Stage)

SignatureKind = Literal["cause", "latent", "crash"]

WorkaroundName = Literal[
    "realign-param-index", "restore-adam-step", "load-no-grad", "load-absent-step", "match-groups-by-lr-bounds"
]
WORKAROUND_NAMES: tuple[WorkaroundName, ...] = get_args(WorkaroundName)
REALIGN: WorkaroundName = "realign-param-index"
LOAD_NO_GRAD: WorkaroundName = "load-no-grad"
RESTORE_STEP: WorkaroundName = "restore-adam-step"
LOAD_ABSENT_STEP: WorkaroundName = "load-absent-step"
MATCH_GROUPS: WorkaroundName = "match-groups-by-lr-bounds"

# Probe keys of a phase document. State probes run at a moment: at the save, or right after the load.
Moment = Literal["at_save", "after_load"]
INDEX_MAP: Literal["index_map"] = "index_map"
INDEX_MAP_EFFECTIVE: Literal["index_map_effective"] = "index_map_effective"
BUCKETS: Literal["buckets"] = "buckets"
FINGERPRINTS: dict[Moment, Literal["fingerprints_at_save", "fingerprints_after_load"]] = {
    "at_save": "fingerprints_at_save",
    "after_load": "fingerprints_after_load",
}
PARAM_GROUPS: dict[Moment, Literal["param_groups_at_save", "param_groups_after_load"]] = {
    "at_save": "param_groups_at_save",
    "after_load": "param_groups_after_load",
}

# The full state snapshot (jobs/rank/probes/state.py), per rank: {section: {name: exact text}}.
STATE_AT_SAVE: Literal["state_at_save"] = "state_at_save"
STATE_AFTER_SAVE: Literal["state_after_save"] = "state_after_save"
STATE_AFTER_LOAD_RAW: Literal["state_after_load_raw"] = "state_after_load_raw"  # before any workaround
STATE_AFTER_LOAD: Literal["state_after_load"] = "state_after_load"  # after them (only when one changed state)
STATE_FINAL: Literal["state_final"] = "state_final"  # after step M, in both phases
# The resume's state right before it reads the checkpoint (what an item the load skipped keeps).
STATE_BEFORE_LOAD: Literal["state_before_load"] = "state_before_load"
# What the checkpoint holds and what the load asked it for (jobs/rank/probes/checkpoint_contents.py).
CHECKPOINT_CONTENTS: Literal["checkpoint_contents"] = "checkpoint_contents"
# The resume's numeric distance from the saving run's final state (jobs/rank/probes/final_numeric.py).
STATE_FINAL_DELTAS: Literal["state_final_deltas"] = "state_final_deltas"
# Bug C: every rank's param groups right after optimizer.load_state_dict, before the scheduler.
GROUPS_AFTER_OPTIMIZER_LOAD: Literal["param_groups_after_optimizer_load"] = "param_groups_after_optimizer_load"
# Whether a load outside torch.no_grad() would raise on FP32 leaf views (what load-no-grad hides).
FP32_VIEW_INPLACE: Literal["fp32_view_inplace"] = "fp32_view_inplace"
StateSnapshot = dict[str, dict[str, str]]

# Probe names of the flattened findings the service stores and the dashboard groups.
FindingProbe = Literal[
    "index_map", "bucket_offsets", "param_group_agreement", "checkpoint_slot_fingerprints",
    "restored_state_fingerprints",
]


class ErrorRecord(TypedDict):
    """Why a phase (or the verdict) failed; `rank_errors` lists every rank's own record."""

    type: str
    message: str
    traceback: str
    stage: Stage
    rank: int | None
    ranks: NotRequired[list[int]]  # every rank that raised this same error (jobs/errors.py)
    rank_errors: NotRequired[list[ErrorRecord]]  # the other distinct errors, without tracebacks


def error_record(
    type_: str, message: str, *, stage: Stage, rank: int | None = None, traceback: str = ""
) -> ErrorRecord:
    """Build an error record (the one constructor; messages and tracebacks are capped)."""
    return {"type": type_, "message": message[:2000], "traceback": traceback[-8000:], "stage": stage, "rank": rank}


def exception_record(exc: BaseException, stage: Stage, rank: int | None = None) -> ErrorRecord:
    """Describe an exception as an error record: a wrapper of ranks' failures by what failed, where it was raised."""
    text = "".join(tb.format_exception(exc))
    failure = wrapped_failure(exc)
    if failure is None:
        return error_record(type(exc).__name__, str(exc), stage=stage, rank=rank, traceback=text)
    inner, frames = failure
    where = "".join(tb.format_list(frames)) + "".join(tb.format_exception_only(type(inner), inner))
    return error_record(type(inner).__name__, str(inner), stage=stage, rank=rank,
                        traceback=f"{text}\nwhere it was raised:\nTraceback (most recent call last):\n{where}")


def wrapped_failure(exc: BaseException) -> tuple[BaseException, tb.StackSummary] | None:
    """The first rank's own failure inside torch.distributed.checkpoint's CheckpointException (which wraps each
    failing rank's exception with its frames, and gathers them to every rank), or None for any other exception.

    Without it a build's load that raises in its own planner (a shape it refuses) reads as torch's reduce_scatter
    raising, a transport frame, and the build's answer passes for the harness's error."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return None
    _, pair = min(failures.items(), key=lambda item: str(item[0]))
    if isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], BaseException) \
            and isinstance(pair[1], tb.StackSummary):
        return pair[0], pair[1]
    return None


class StepRecord(TypedDict):
    """One training step as a rank records it (loss is the mean over ranks)."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    num_zeros: int | None
    update_successful: bool
    wall_s: float
    mtp_loss: NotRequired[list[float]]  # configs with an MTP head: each depth's loss (DP mean)
    # rank 0's optimizers, read right before optimizer.step(): {"o<i>.g<j>": [lr, weight_decay, adam step]}
    applied: NotRequired[dict[str, list[float | None]]]


class IndexMapReport(TypedDict):
    """Bug A probe over all ranks: index-map entries pointing at other params' shards."""

    applicable: bool
    misaligned_total: int
    unexplained_total: NotRequired[int]  # misaligned entries not at the slot Bug A predicts (a new bug)
    per_rank: list[dict[str, Any]]
    reason: NotRequired[str]  # why the probe could not look ("not applicable on this build: ...")


class BucketsReport(TypedDict):
    """Bug B probe over all ranks: bucket param offsets not 64-aligned."""

    applicable: bool
    unaligned_total: int
    per_rank: list[dict[str, Any]]
    reason: NotRequired[str]  # why the probe could not look ("not applicable on this build: ...")


class FingerprintsReport(TypedDict):
    """Per-rank {param: {key: fingerprint}} of owned state (and, at save, of the checkpoint slots)."""

    owned: list[dict[str, Any] | None]
    slots: list[dict[str, Any] | None] | None


class ParamGroupsReport(TypedDict):
    """Bug C probe: param-group metadata across ranks."""

    agree: bool
    disagreements: list[dict[str, Any]]
    empty_rank_groups: list[dict[str, Any]]
    per_rank: list[list[dict[str, Any]]]


class SectionDelta(TypedDict):
    """How far one numeric section of the resumed final state is from the saving run's."""

    max_rel: float | str  # largest ||resumed - baseline|| / ||baseline|| of one item ("inf": an item is missing)
    max_abs: float | str  # largest absolute element difference
    worst: str | None  # the item with max_rel
    differing: int
    items: int


class FinalDeltasReport(TypedDict):
    """The resume's numeric distance to the saving run's final state, per numeric section."""

    view: str  # "per-rank" (rank r against the saving run's rank r) or "global" (a resharded run)
    ranks: int
    sections: dict[str, SectionDelta]  # model, main, moments; {} when it could not compare
    error: NotRequired[str]  # why it could not compare (the saving run's tensors unreadable)


class PhaseProbes(TypedDict, total=False):
    """A phase document's probes; which ones a finished phase must carry is `required_probes()`."""

    index_map: IndexMapReport
    index_map_effective: IndexMapReport
    buckets: BucketsReport
    fingerprints_at_save: FingerprintsReport
    fingerprints_after_load: FingerprintsReport
    param_groups_at_save: ParamGroupsReport
    param_groups_after_load: ParamGroupsReport
    state_at_save: list[StateSnapshot]
    state_after_save: list[StateSnapshot]
    state_after_load_raw: list[StateSnapshot]
    state_after_load: list[StateSnapshot]
    state_final: list[StateSnapshot]
    state_final_deltas: FinalDeltasReport
    state_before_load: list[StateSnapshot]
    checkpoint_contents: dict[str, Any]
    param_groups_after_optimizer_load: list[dict[str, str]]
    fp32_view_inplace: list[dict[str, Any]]


class PhaseDocument(TypedDict):
    """What one phase returns: rank 0's document, carrying every rank's probes."""

    schema_version: int
    status: PhaseStatus
    phase: PhaseName
    rank: int
    spec: dict[str, Any]
    steps: list[StepRecord]
    probes: PhaseProbes
    workarounds: dict[str, Any]
    info: dict[str, Any]
    error: ErrorRecord | None
    stage_seconds: NotRequired[dict[str, float]]
    # multi-node: the hostname of the node this rank ran on (each rank's own document), and on the
    # merged phase document every rank's node, indexed by rank (None: that rank wrote no document)
    node: NotRequired[str]
    rank_nodes: NotRequired[list[str | None]]


def phase_document(
    spec: dict[str, Any], phase: PhaseName, rank: int, *, status: PhaseStatus = "running",
    error: ErrorRecord | None = None,
) -> PhaseDocument:
    """A new phase document (the one constructor ranks and launchers use)."""
    return {
        "schema_version": PHASE_SCHEMA_VERSION,
        "status": status,
        "phase": phase,
        "rank": rank,
        "spec": spec,
        "steps": [],
        "probes": {},
        "workarounds": {},
        "info": {},
        "error": error,
    }


# Per phase: (stages entered only after the build probes are in the document, the state probes of
# the phase, stages entered only after those are in). A phase that failed in such a stage carries them.
_PROBES_BEFORE: dict[str, tuple[tuple[Stage, ...], tuple[str, ...], tuple[Stage, ...]]] = {
    "train_and_save": (("step", "save"), (FINGERPRINTS["at_save"], PARAM_GROUPS["at_save"]), ("save",)),
    "resume": (("load", "step"), (FINGERPRINTS["after_load"], PARAM_GROUPS["after_load"]), ("step",)),
    "uninterrupted": (("step",), (), ()),
}
# The state snapshots (schema 3 on): those taken with the stage-gated probes above, and those a
# phase takes only once it has finished (after the save, after step M, the distance to the saving run).
_SNAPSHOTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "train_and_save": ((STATE_AT_SAVE,), (STATE_AFTER_SAVE, STATE_FINAL)),
    "resume": ((STATE_AFTER_LOAD_RAW, GROUPS_AFTER_OPTIMIZER_LOAD), (STATE_FINAL, STATE_FINAL_DELTAS)),
}


def required_probes(
    phase: str, workarounds: list[str] | tuple[str, ...], failed_stage: str | None = None,
    schema_version: int = PHASE_SCHEMA_VERSION,
) -> tuple[str, ...]:
    """The probes a phase must carry: all of them once it finished, or those taken before the stage it failed in.

    A required probe missing from a document is an error, never "no finding". Documents older than
    schema 3 predate the state snapshots and are judged without them (the optimizer fingerprints).
    """
    build = (INDEX_MAP, BUCKETS, *((INDEX_MAP_EFFECTIVE,) if REALIGN in workarounds else ()))
    after_build, state, after_state = _PROBES_BEFORE.get(phase, ((), (), ()))
    if schema_version >= STATE_PROBES_SINCE:
        gated, finished = _SNAPSHOTS.get(phase, ((), ()))
        restored: tuple[str, ...] = ()
        if phase == "resume":  # what the restore workarounds record: the state after them, the no-grad trial
            restored += (STATE_AFTER_LOAD,) if RESTORE_STEP in workarounds else ()
            restored += (FP32_VIEW_INPLACE,) if {REALIGN, LOAD_NO_GRAD} & set(workarounds) else ()
        state = (*state, *gated, *restored)
    else:
        finished = ()
    if failed_stage is None:
        return (*build, *state, *finished)
    return (*(build if failed_stage in after_build else ()), *(state if failed_stage in after_state else ()))


class StepRow(TypedDict):
    """One step of the comparison: both runs' values, deltas (resumed - baseline) and checks."""

    step: int
    resumed_phase: bool
    loss_baseline: float | None
    loss_resumed: float | None
    lr_baseline: float | None
    lr_resumed: float | None
    grad_norm_baseline: float | None
    grad_norm_resumed: float | None
    num_zeros_baseline: int | None
    num_zeros_resumed: int | None
    wall_s_baseline: float | None
    wall_s_resumed: float | None
    loss_abs_delta: float | None
    loss_rel_delta: float | None
    lr_abs_delta: float | None
    lr_rel_delta: float | None
    within_tolerance: bool | None
    exact: NotRequired[bool]
    differing_metrics: NotRequired[list[str]]
    loss_within_tolerance: NotRequired[bool]
    lr_within_tolerance: NotRequired[bool]
    metrics_within_tolerance: NotRequired[bool]


class ProbeFindingRow(TypedDict):
    """One flattened probe result: one per probe, plus one per implicated param."""

    phase: PhaseName
    probe: FindingProbe
    ok: bool
    param_name: str | None
    detail: dict[str, Any]


class PhaseSummary(TypedDict):
    """What the result keeps of a phase document besides steps and probes."""

    status: PhaseStatus
    error: ErrorRecord | None
    info: dict[str, Any]
    stage_seconds: dict[str, float]
    workarounds: dict[str, Any]
    rank_nodes: NotRequired[list[str | None]]  # multi-node: each rank's node, indexed by rank


class ParityResult(TypedDict):
    """What `evaluate()` returns: the verdict and everything that explains it."""

    schema_version: int
    verdict: Verdict
    # the verdict as the matrix shows it: "pass (worked around)" when a workaround hid a finding
    verdict_label: NotRequired[str]
    signatures: list[SignatureId]
    advisories: list[SignatureId]
    worked_around: list[SignatureId]
    worked_around_by: NotRequired[dict[str, list[SignatureId]]]  # workaround -> the findings it hid
    worked_around_evidence: NotRequired[dict[str, Any]]  # finding -> its evidence before the workaround
    workarounds_not_needed: NotRequired[list[str]]  # requested workarounds whose known bug did not fire
    evidence: dict[str, Any]
    errors: list[ErrorRecord]
    error: ErrorRecord | None
    probe_findings: list[ProbeFindingRow]
    first_divergent_step: int | None
    first_step_beyond_tolerance: int | None
    lanes: dict[str, Any]
    steps: list[StepRow]
    spec: dict[str, Any]
    probes: dict[str, PhaseProbes | None]
    phases: dict[str, PhaseSummary | None]
    run_folder: NotRequired[str]
    timing: NotRequired[dict[str, float | None]]
    # "process" (a forked child per phase in one job) or "job" (a job per phase); absent before it existed
    isolation: NotRequired[str]
    # a resume at another DP size (spec.resume_dp): the layouts, batches, tolerance and isolation it ran with
    reshard: NotRequired[dict[str, Any]]
    # signature -> one line naming what the resume lost (section, state-dict name, how), for every
    # cause whose evidence is a state diff (jobs/verdict/causes.py); every surface shows it as is
    cause_lines: NotRequired[dict[str, str]]


def parity_result(
    verdict: Verdict, spec: dict[str, Any], *, errors: list[ErrorRecord] | None = None, **fields: Any
) -> ParityResult:
    """A parity result with every key present (the one constructor; `fields` fill the rest)."""
    errors = errors or []
    result: ParityResult = {
        "schema_version": RESULT_SCHEMA_VERSION,
        "verdict": verdict,
        "verdict_label": verdict,
        "signatures": [],
        "advisories": [],
        "worked_around": [],
        "worked_around_by": {},
        "worked_around_evidence": {},
        "evidence": {},
        "errors": errors,
        "error": errors[0] if errors else None,
        "probe_findings": [],
        "first_divergent_step": None,
        "first_step_beyond_tolerance": None,
        "lanes": {},
        "steps": [],
        "spec": spec,
        "probes": {},
        "phases": {},
    }
    unknown = set(fields) - set(ParityResult.__annotations__)
    if unknown:
        raise TypeError(f"unknown parity result fields: {sorted(unknown)}")
    result.update(fields)  # type: ignore[typeddict-item]
    return result
