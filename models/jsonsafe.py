"""JSONB and text that accept whatever a job returns: non-finite floats and NUL characters included.

Postgres refuses `NaN`/`Infinity` in JSON and `\\u0000` in JSONB strings, so a single NaN loss
would make a whole document unstorable. On the way in, non-finite floats become the strings
"NaN", "Infinity" and "-Infinity", NUL becomes U+FFFD, and anything else json cannot write
becomes its str(). `decode_nonfinite` turns those three strings back into floats where the
numbers are used (the evaluator); the API and dashboard show the strings, which is valid JSON.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import Text, TypeDecorator

NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode(value: Any) -> Any:
    """A copy of value that Postgres JSONB accepts (see the module docstring)."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {encode(str(k)): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return encode(str(value))


def decode_nonfinite(value: Any) -> Any:
    """A copy of a stored document with "NaN"/"Infinity"/"-Infinity" strings turned back into floats."""
    if isinstance(value, str):
        return NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: decode_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_nonfinite(v) for v in value]
    return value


class SafeJSONB(TypeDecorator[Any]):
    """JSONB whose values are made storable by `encode` before they are sent."""

    impl = JSONB
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        """Encode a value on its way to Postgres."""
        return encode(value)


class SafeText(TypeDecorator[str]):
    """Text with NUL made U+FFFD on its way in: Postgres refuses NUL in any text column, and a message a job
    or a build wrote (an exception's text, a log line) is stored in one. Refused, the UPDATE would fail the
    scheduler's whole pass on every try; a NUL in a client's input is refused at the API (core/inputs.py)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        """Replace NUL on the way to Postgres."""
        return None if value is None else str(value).replace("\x00", "\ufffd")
