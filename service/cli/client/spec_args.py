"""The run spec's command-line options, generated from the engine's `RunSpec` (jobs/spec.py): one option
per field, with its help, bounds and allowed values from the field's `about` metadata, so a field added
to RunSpec is an option of `parity submit` with nothing else to edit (tests/service/test_check_spec.py).

An option left off is left out of the body and the service applies RunSpec's default; a required field
takes its `suggested` value. Allowed values are shown, not enforced here: the service names the field
and what it allows, for the version it runs (a client may be older than the service it talks to).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from jobs.spec import RunSpec, field_default
from service.cli.client.shape_arg import parse_shape


def _flag(f: dataclasses.Field[Any]) -> str:
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def _help(f: dataclasses.Field[Any], default: Any) -> str:
    about = f.metadata
    parts = [about["help"]]
    lo = about["ge"]
    hi = about["le"] if about["le"] is not None else about["lt"] - 1 if about["lt"] is not None else None
    if lo is not None or hi is not None:
        parts.append(f"{lo if lo is not None else ''}..{hi if hi is not None else ''}")
    for name, label in (("choices", "one of"), ("each", "repeatable, each one of"), ("keys", "repeatable KEY=VALUE "
                                                                                       "or a JSON object; keys")):
        if about[name] is not None:
            parts.append(f"{label}: {', '.join(str(v) for v in about[name])}")
    shown = about["suggested"] if default is dataclasses.MISSING else default
    if shown not in (None, (), {}, False):
        parts.append(f"default {shown}")
    return "; ".join(parts)


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """One option per RunSpec field (the parser's destination is the field's name)."""
    hints = typing.get_type_hints(RunSpec)
    for f in dataclasses.fields(RunSpec):
        if "help" not in f.metadata:
            raise TypeError(f"RunSpec.{f.name} has no `about(...)` metadata: give it a help line and its bounds")
        hint, about = hints[f.name], f.metadata
        shown = argparse.SUPPRESS if about["hidden"] else _help(f, field_default(f))
        options: dict[str, Any] = {"dest": f.name, "help": shown}
        origin = typing.get_origin(hint)
        if hint is bool:
            options.update(action="store_true", default=None)
        elif origin in (tuple, dict):
            options.update(action="append", default=[])
            if origin is dict:
                options["metavar"] = "KEY=VALUE"
        else:
            scalar = int if int in (hint, *typing.get_args(hint)) else str
            options.update(type=scalar, default=about["suggested"])
        p.add_argument(_flag(f), **options)


def spec_of(args: argparse.Namespace) -> dict[str, Any]:
    """The spec object of the parsed options: each field given (or suggested), none the service would default."""
    hints = typing.get_type_hints(RunSpec)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(RunSpec):
        value = getattr(args, f.name, None)  # a hand-built Namespace may lack the newer options
        if value is None or value == [] or value is False:
            continue
        spec[f.name] = parse_shape(value) if typing.get_origin(hints[f.name]) is dict else value
    return spec
