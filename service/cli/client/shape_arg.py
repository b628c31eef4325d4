"""`--shape key=value` (or a JSON object): the custom-shape option shared by `submit` and `run-local`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from jobs.shape import SHAPE_FIELDS


def shape_help() -> str:
    """Help text listing every shape field with its range or allowed values."""
    parts = []
    for name, f in SHAPE_FIELDS.items():
        rng = f"{f.lo}..{f.hi}" if f.kind == "int" else "true|false"
        parts.append(f"{name} {rng}" + (" (MoE configs)" if f.moe_only else ""))
    return ("override the preset's shape, repeatable key=value or one JSON object; fields: " + ", ".join(parts)
            + ". Rules: hidden_size divisible by num_attention_heads (even head dim), moe_router_topk <= "
            "num_experts, gpt configs only; `parity configs --json` shows each preset's values")


def add_shape_argument(p: argparse.ArgumentParser) -> None:
    """Add the repeatable --shape option."""
    p.add_argument("--shape", action="append", default=[], metavar="KEY=VALUE", help=shape_help())


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text  # the spec names the field and its range


def parse_shape(items: list[str]) -> dict[str, Any]:
    """The --shape items as one object (JSON objects merged, key=value pairs typed)."""
    shape: dict[str, Any] = {}
    for item in items:
        if item.lstrip().startswith("{"):
            try:
                data = json.loads(item)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"--shape: not a JSON object: {exc}") from None
            if not isinstance(data, dict):
                raise SystemExit("--shape: a JSON value must be an object")
            shape.update(data)
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--shape expects key=value or a JSON object, got {item!r}; keys: "
                             + ", ".join(SHAPE_FIELDS))
        shape[key.strip()] = _value(value)
    return shape
