"""Request and response bodies of the REST API (what the OpenAPI document describes)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    computed_field,
    create_model,
    model_validator,
)

from jobs.contract import ProbeFindingRow, StepRow
from jobs.verdict_names import RunVerdict
from models import ProbeFinding, StepMetric
from service.core.check_spec import CheckSpec
from service.core.limits import MAX_LABELS
from service.core.outcome import CiOutcome

LABEL_KEY_PATTERN = r"^[A-Za-z0-9_.\-/]{1,64}$"


LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, StringConstraints(max_length=500)]
# Labels the service itself writes and then trusts to find a run's sweep, bisect or self-test batch:
# a client that set them could replace a cell of someone else's sweep or end their bisect.
# A suite run's checks carry its id and names: a client run tagged with another suite run would be listed under it
# and, as "one of its checks", alert nobody (a suite alerts once, as the suite run).
SUITE_LABELS = ("suite", "suite_run", "suite_check")
RESERVED_LABELS = frozenset({"sweep", "variation", "bisect", "mutant", *SUITE_LABELS})
RESERVED_PREFIXES = ("selftest",)


def is_reserved(key: str) -> bool:
    """Whether a label key is the service's own (never accepted from a client)."""
    return key in RESERVED_LABELS or key.startswith(RESERVED_PREFIXES)


def _no_reserved(labels: dict[str, str]) -> dict[str, str]:
    taken = sorted(k for k in labels if is_reserved(k))
    if taken:
        allowed_not = ", ".join([*sorted(RESERVED_LABELS), *(f"{p}*" for p in RESERVED_PREFIXES)])
        raise ValueError(f"{', '.join(taken)}: reserved for the service ({allowed_not}); choose another label key")
    return labels


# the labels a client may set on a run, a sweep or a bisect
ClientLabels = Annotated[dict[LabelKey, LabelValue], AfterValidator(_no_reserved)]


class RunCreate(BaseModel):
    """POST /runs: a spec (validated against the named config), an environment and CI labels."""

    model_config = ConfigDict(extra="forbid")

    spec: CheckSpec = Field(
        description="The check (its fields, bounds and allowed values below; each config's own limits and "
        "shape fields: GET /api/v1/configs)",
        examples=[{"config": "moe-fp32-router", "dp": 2, "steps": 20, "save_step": 10}],
    )
    # bounded like the column it lands in (environments.name is 200 characters)
    environment: str = Field(default="default", max_length=200, description="Name of a registered environment")
    labels: ClientLabels = Field(
        default_factory=dict, max_length=MAX_LABELS,
        description=f"CI labels (at most {MAX_LABELS}): commit, branch, pr, pipeline_url; "
        "sweep, variation, bisect, mutant and selftest* are the service's own and refused",
    )


class RunLinks(BaseModel):
    self: str
    metrics: str
    dashboard: str
    triage: str


class PhaseOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    attempt: int
    state: str
    executor: str
    job_id: str | None
    folder: str | None
    exit_reason: str | None
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    duration_s: float | None
    save_s: float | None
    load_s: float | None
    rank_nodes: list[str | None] = Field(
        default_factory=list, description="The node (hostname) each rank ran on, indexed by rank; [] until known"
    )


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    config: str
    spec: dict[str, Any]
    check_key: str = Field(description="Stable hash of the canonical spec: runs with equal keys are one check")
    check_name: str = Field(description="Readable form of the check")
    track: str = Field(description="Where the check's history accumulates: the branch label, else the environment")
    compared_track: str | None = Field(description="Whose history the verdict was compared with (own or base track)")
    regression_text: str | None = Field(default=None, description="e.g. 'regression against main'")
    known_failures: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Known upstream bugs that explain a known-failure verdict: id, signature, link")
    fixed_known: list[dict[str, Any]] = Field(
        default_factory=list,
        description="'fixed?': known failures the previous run of this check had and this one lacks")
    environment: str
    labels: dict[str, str]
    requester: str | None
    state: str
    state_version: int = Field(description="How many state changes the run has had: a wait asks past it")
    # the contract's parity verdicts, plus the service's own for failures explained by known upstream bugs
    verdict: RunVerdict | None
    verdict_label: str | None = Field(
        default=None,
        description='The verdict with its qualifiers (reading.label): "pass (worked around: realign-param-index)", '
                    '"fail (regression against main)"; null before a verdict',
    )
    reading: dict[str, Any] = Field(
        default_factory=dict,
        description="How the verdict reads (service/core/verdicts.reading): label with its qualifiers, cause as a "
                    "sentence plus the slug, step, bound (tolerance-judged checks), slugs, and all of it as one line")
    signatures: list[str]
    worked_around: list[str] = Field(default_factory=list, description="Findings a requested workaround neutralised")
    worked_around_by: dict[str, list[str]] = Field(default_factory=dict, description="Workaround -> findings it hid")
    regression: bool
    first_divergent_step: int | None
    first_step_beyond_tolerance: int | None
    max_abs_loss_delta: float | None
    error_message: str | None
    last_good_run_id: int | None
    failing_since_run_id: int | None
    rerun_of_id: int | None
    cancel_requested: bool
    created_at: datetime
    submitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    links: RunLinks
    outcome: CiOutcome = Field(description="What the run means for CI, computed by the server "
                                           "(service/core/outcome.py): result, exit code, exit code with --strict")
    phases: list[PhaseOut] | None = None


class RunPage(BaseModel):
    items: list[RunOut]
    limit: int
    offset: int
    has_more: bool
    next: str | None


def _stored(row: Any, table: Any, name: str, *, widen: frozenset[str] = frozenset()) -> type[BaseModel]:
    """The API's model of one stored row of a job's result: the contract's TypedDict (jobs/contract.py),
    field for field and type for type, less what the table does not keep. `widen` are Literal fields
    read back as plain strings: older builds' rows may hold names the current contract no longer has."""
    kept = {c.name for c in table.__table__.columns}
    hints = get_type_hints(row)
    fields: dict[str, Any] = {k: (str if k in widen else t, ...) for k, t in hints.items() if k in kept}
    return create_model(name, __config__=ConfigDict(from_attributes=True), __doc__=row.__doc__, **fields)


# one step of the comparison, as the job's StepRow has it (the columns step_metrics keeps)
StepMetricOut = _stored(StepRow, StepMetric, "StepMetricOut")
# one probe finding, as the job's ProbeFindingRow has it
ProbeFindingOut = _stored(ProbeFindingRow, ProbeFinding, "ProbeFindingOut", widen=frozenset({"phase", "probe"}))


class RunMetrics(BaseModel):
    run_id: int
    # made from the contract's TypedDicts at import (_stored): classes to pydantic, variables to mypy
    steps: list[StepMetricOut]  # type: ignore[valid-type]
    probes: list[ProbeFindingOut]  # type: ignore[valid-type]


class EnvironmentIn(BaseModel):
    """POST /environments: register a prepared `python` (admin), or build from `requirements` (submit)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.\-]{1,200}$",
        description="Unique name; required with python, defaults to build-<hash> with requirements",
    )
    python: str | None = Field(
        default=None, min_length=1, max_length=1000,
        description="Absolute path of a Python that imports torch and megatron.core (no whitespace)",
    )
    requirements: list[Annotated[str, Field(max_length=500)]] | None = Field(
        default=None, min_length=1, max_length=32,
        description="pip requirement lines: megatron-core==0.15.3, /abs/path/to/wheel-or-source-dir, "
        "git+https://host/repo@<commit sha>",
        examples=[["megatron-core==0.15.3"]],
    )
    description: str = Field(default="", max_length=2000)

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentIn:
        if (self.python is None) == (self.requirements is None):
            raise ValueError("give exactly one of python (a prepared environment) or requirements (a build)")
        if self.python is not None and self.name is None:
            raise ValueError("name is required when registering a python")
        return self


class EnvironmentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    python: str
    description: str
    packages: dict[str, Any]
    state: str = Field(description="ready | pending | building | failed | pruned")
    requirements: list[str] | None
    content_hash: str | None
    megatron_core: str | None
    torch: str | None
    error_message: str | None
    freeze: list[str]

    @computed_field(  # type: ignore[prop-decorator]
        description="What the harness detected in this build (sharding types, save strategy, "
        "optimizer priming, ...): jobs/rank/compat.capabilities(); empty before it is built")
    @property
    def capabilities(self) -> dict[str, Any]:
        caps = self.packages.get("capabilities") if isinstance(self.packages, dict) else None
        return caps if isinstance(caps, dict) else {}

    build_seconds: float | None
    built_at: datetime | None
    last_used_at: datetime | None
    created_at: datetime
    source: str | None = Field(default=None, description="The source a commit build was made from")
    source_commit: str | None = Field(default=None, description="The commit built (a plain tree: its content hash)")
    source_commit_date: datetime | None = None
    source_commit_subject: str | None = Field(default=None, description="The commit's subject line")


class ErrorOut(BaseModel):
    error: str = Field(description="Stable error code")
    detail: str = Field(description="What went wrong, naming the field")
    field: str | None = None
    errors: list[dict[str, Any]] | None = Field(default=None, description="Every validation problem (422 only)")


# Every route can answer with the one error shape; documenting it keeps the OpenAPI document true.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}
