"""CheckSpec: a run spec as the API takes it, generated from the engine's `RunSpec` and parsed once per request.

`jobs/spec.py` (`RunSpec`) owns what a check is: its fields, their defaults, their descriptions and
bounds (each field's `about` metadata) and every rule, checked where it is built, in the job as in the
service (jobs/ takes no pydantic). This model is generated from those fields, so `/openapi.json` states
each with its type, bounds and allowed values and a field added to RunSpec appears here by itself; a
wrap validator builds the `RunSpec` once and keeps it (`run_spec`), so nothing after the body parse
parses the spec again. A `RunSpec` error is a 422 naming the field (`spec.<field>`) and its allowed
values; tests/service/test_check_spec.py holds the two in step.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, PrivateAttr, create_model, model_validator

from jobs.spec import RunSpec, SpecError, field_default
from service.core.errors import InvalidSpec


class _SpecModel(BaseModel):
    """One parity check: train `steps` steps saving at `save_step`, resume from there in fresh processes,
    compare. Cross-field rules (save_step < steps, dp within the config's maximum, the parallel layout,
    nodes dividing dp, …) are the engine's; GET /api/v1/configs lists each config's allowed values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    _run_spec: RunSpec = PrivateAttr()

    @model_validator(mode="wrap")
    @classmethod
    def _parse_once(cls, data: Any, handler: ModelWrapValidatorHandler[_SpecModel]) -> _SpecModel:
        if isinstance(data, cls):
            return data
        run_spec = run_spec_of(data)
        # the engine's normal form (defaults filled in, names sorted): always within the bounds stated
        model = handler({f.name: _plain(getattr(run_spec, f.name)) for f in dataclasses.fields(RunSpec)})
        model._run_spec = run_spec
        return model

    @property
    def run_spec(self) -> RunSpec:
        """The engine's spec, built once when the request was parsed."""
        return self._run_spec


def _annotation(hint: Any) -> Any:
    # the engine's tuples of names are JSON lists
    if typing.get_origin(hint) is tuple:
        return list[typing.get_args(hint)[0]]  # type: ignore[misc]
    return hint


def model_field(f: dataclasses.Field[Any], hint: Any) -> tuple[Any, Any]:
    """(annotation, pydantic Field) of one RunSpec field, from its type, default and `about` metadata."""
    about = f.metadata
    if "help" not in about:
        raise TypeError(f"RunSpec.{f.name} has no `about(...)` metadata: give it a help line and its bounds")
    extra: dict[str, Any] = {}
    if about["choices"] is not None:
        extra["enum"] = list(about["choices"])
    if about["each"] is not None:
        extra["items"] = {"type": "string", "enum": list(about["each"])}
    if about["keys"] is not None:
        extra["propertyNames"] = {"enum": list(about["keys"])}
    kwargs: dict[str, Any] = {"description": about["help"], "json_schema_extra": extra or None}
    kwargs.update({bound: about[bound] for bound in ("ge", "le", "lt") if about[bound] is not None})
    default = field_default(f)
    if default is dataclasses.MISSING:
        return _annotation(hint), Field(**kwargs)
    if isinstance(default, (tuple, dict)):
        return _annotation(hint), Field(default_factory=list if isinstance(default, tuple) else dict, **kwargs)
    return _annotation(hint), Field(default=default, **kwargs)


def _generated() -> type[_SpecModel]:
    hints = typing.get_type_hints(RunSpec)
    spec_fields: dict[str, Any] = {f.name: model_field(f, hints[f.name]) for f in dataclasses.fields(RunSpec)}
    return create_model("CheckSpec", __base__=_SpecModel, __doc__=_SpecModel.__doc__, **spec_fields)


if TYPE_CHECKING:
    CheckSpec = _SpecModel
else:
    CheckSpec = _generated()


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
