"""CheckSpec: a run spec as the API takes it, parsed once per request into the engine's `RunSpec`.

`jobs/spec.py` (`RunSpec`) owns what a check is: its fields, their defaults and every rule, checked
where it is built, in the job as in the service (jobs/ takes no pydantic). This model is how the API
states it: each field with its type, bounds and allowed values, so `/openapi.json` says what a check
is, and a wrap validator that builds the `RunSpec` once and keeps it (`run_spec`), so nothing after
the body parse parses the spec again. A `RunSpec` error is a 422 naming the field (`spec.<field>`)
and its allowed values, as before; tests/service/test_check_spec.py holds the two in step.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, PrivateAttr, model_validator

from jobs import parallel_layout
from jobs.configs import config_names
from jobs.selftest.catalogue import mutant_names
from jobs.shape import SHAPE_FIELDS
from jobs.spec import (
    DEVICES,
    ISOLATION_MODES,
    MAX_DP,
    MAX_STEPS,
    SHARDING_TYPES,
    TOLERANCES,
    WORKAROUNDS,
    RunSpec,
    SpecError,
    field_default,
)
from service.core.errors import InvalidSpec

_DEFAULTS = {f.name: field_default(f) for f in fields(RunSpec)}


def _one_of(values: Any) -> dict[str, Any]:
    return {"enum": list(values)}


def _names(values: Any) -> dict[str, Any]:
    return {"items": {"type": "string", "enum": list(values)}}


class CheckSpec(BaseModel):
    """One parity check: train `steps` steps saving at `save_step`, resume from there in fresh processes,
    compare. Cross-field rules (save_step < steps, dp within the config's maximum, the parallel layout,
    nodes dividing dp, …) are the engine's; GET /api/v1/configs lists each config's allowed values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: str = Field(description="A named config (GET /api/v1/configs)", json_schema_extra=_one_of(config_names()))
    dp: int = Field(ge=1, le=MAX_DP, description="Data-parallel ranks (at most the config's max_dp)")
    steps: int = Field(ge=2, le=MAX_STEPS, description="Training steps M (more than the config's LR warmup)")
    save_step: int = Field(ge=1, lt=MAX_STEPS, description="The step N the checkpoint is saved at (N < M)")
    sharding: str = Field(default=_DEFAULTS["sharding"], description="Distributed-optimizer checkpoint format",
                          json_schema_extra=_one_of(SHARDING_TYPES))
    seed: int = Field(default=_DEFAULTS["seed"], ge=0, le=2**63 - 1)
    tolerance: str = Field(default=_DEFAULTS["tolerance"], description="The tolerance profile the run is judged by",
                           json_schema_extra=_one_of(TOLERANCES))
    workarounds: list[str] = Field(default_factory=list, description="Workarounds of known upstream bugs",
                                   json_schema_extra=_names(WORKAROUNDS))
    mutants: list[str] = Field(default_factory=list, description="Injected resume bugs (the detector's self-test)",
                               json_schema_extra=_names(mutant_names()))
    isolation: str = Field(default=_DEFAULTS["isolation"], description="process: one job forks each phase; "
                           "job: each phase its own job", json_schema_extra=_one_of(ISOLATION_MODES))
    resume_dp: int | None = Field(default=None, ge=1, le=MAX_DP,
                                  description="Resume at another DP size (absent: dp); differs from dp")
    nodes: int = Field(default=_DEFAULTS["nodes"], ge=1, le=MAX_DP, description="Slurm nodes; divides dp")
    shape: dict[str, Any] = Field(default_factory=dict, description="Overrides of the config's model shape",
                                  json_schema_extra={"propertyNames": _one_of(SHAPE_FIELDS)})
    tp: int = Field(default=1, ge=1, le=parallel_layout.MAX_TP, description="Tensor-parallel size")
    pp: int = Field(default=1, ge=1, le=max(parallel_layout.SUPPORTED_PP), description="Pipeline-parallel size")
    ep: int = Field(default=1, ge=1, le=parallel_layout.MAX_EP, description="Expert-parallel size (MoE configs)")
    async_save: bool = Field(default=False, description="Megatron's async checkpoint save")
    fully_parallel: bool = Field(default=False, description="The fully-parallel save/load wrappers")
    device: str = Field(default=_DEFAULTS["device"], description="Where the ranks run: cpu, or cuda (one GPU "
                        "per rank; refused when the executor has fewer GPUs than ranks)",
                        json_schema_extra=_one_of(DEVICES))

    _run_spec: RunSpec = PrivateAttr()

    @model_validator(mode="wrap")
    @classmethod
    def _parse_once(cls, data: Any, handler: ModelWrapValidatorHandler[CheckSpec]) -> CheckSpec:
        if isinstance(data, CheckSpec):
            return data
        run_spec = run_spec_of(data)
        # the engine's normal form (defaults filled in, names sorted): always within the bounds above
        model = handler({f.name: _plain(getattr(run_spec, f.name)) for f in fields(RunSpec)})
        model._run_spec = run_spec
        return model

    @property
    def run_spec(self) -> RunSpec:
        """The engine's spec, built once when the request was parsed."""
        return self._run_spec


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def run_spec_of(data: Any) -> RunSpec:
    """The engine's spec of plain data, or a 422 naming the field (`spec.<field>`) and the allowed values."""
    if not isinstance(data, dict):
        raise InvalidSpec(f"spec: must be an object, got {type(data).__name__}", field="spec")
    try:
        return RunSpec.from_dict(data)
    except SpecError as exc:
        # an error of the whole spec (an unknown key) is the spec's own, not a field "spec.spec"
        raise InvalidSpec(str(exc), field="spec" if exc.field == "spec" else f"spec.{exc.field}") from None
