"""An import report (imported.rank<r>.json) is the build's to write: validate_report takes what the worker
writes and refuses anything else naming the field (service/runs/import_check.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from service.runs.import_check import MalformedReport, validate_report

GOOD = {"ok": True, "torch": "2.13.0+cpu", "megatron_core": "0.16.1",
        "capabilities": {"megatron_core": "0.16.1", "sharding_types": ["dp_reshardable"]}}


def test_what_the_worker_writes_is_accepted() -> None:
    report = validate_report(GOOD)
    assert (report.ok, report.torch, report.megatron_core) == (True, "2.13.0+cpu", "0.16.1")
    assert report.capabilities == GOOD["capabilities"]
    failed = validate_report({"ok": False, "error": "import megatron.core: RuntimeError: boom\x00"})
    assert not failed.ok and failed.error and "boom" in failed.error
    # a field a later worker adds is not an error
    assert validate_report({**GOOD, "seconds": 3.5}).ok


@pytest.mark.parametrize(("change", "field"), [
    ({"ok": "yes"}, "ok"),
    ({"ok": 1}, "ok"),
    ({"ok": None}, "ok"),
    ({"torch": 2.13}, "torch"),
    ({"torch": "x" * 101}, "torch"),
    ({"megatron_core": "0.16.1\x00; DROP"}, "megatron_core"),
    ({"megatron_core": "0.16.1\n<script>"}, "megatron_core"),
    ({"torch": None}, "torch/megatron_core"),
    ({"capabilities": ["a list"]}, "capabilities"),
    ({"capabilities": {"big": "x" * 301}}, "capabilities"),
    ({"capabilities": {"nested": {"a": 1}}}, "capabilities"),
    ({"capabilities": {f"k{i}": True for i in range(41)}}, "capabilities"),
    ({"error": ["not", "text"]}, "error"),
])
def test_a_malformed_report_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(MalformedReport, match=f"^field {field}"):
        validate_report({**GOOD, **change})


def test_a_report_without_ok_is_malformed() -> None:
    with pytest.raises(MalformedReport, match="^field ok"):
        validate_report({"torch": "2.13.0", "megatron_core": "0.16.1"})


def test_capabilities_may_hold_what_json_can_but_postgres_cannot() -> None:
    # NaN and NUL inside capabilities are kept here and made storable where they are stored (jsonsafe)
    report = validate_report({**GOOD, "capabilities": {"x": math.nan, "y": "a\x00b"}})
    assert report.capabilities is not None and math.isnan(report.capabilities["x"])
