"""docs/alerts.yml: example Prometheus rules that load, and only name metrics the service exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from fastapi.testclient import TestClient

RULES = Path(__file__).resolve().parents[2] / "docs" / "alerts.yml"
DURATION = re.compile(r"^\d+[smhdwy]$")


def test_rules_parse_and_use_exported_metrics(client: TestClient) -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert rules and all(group["name"] for group in doc["groups"])
    exported = {ln.split()[2] for ln in client.get("/metrics").text.splitlines() if ln.startswith("# TYPE ")}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"]
        assert DURATION.match(rule.get("for", "0s")), rule
        used = {m for m in re.findall(r"\b(parity_[a-z_]+)", rule["expr"])}
        assert used <= exported, f"{rule['alert']} uses {used - exported}, not exported by /metrics"
    assert {"parity_open_regressions", "parity_oldest_queued_run_age_seconds"} <= {
        m for r in rules for m in re.findall(r"\b(parity_[a-z_]+)", r["expr"])}


def test_promtool_accepts_the_rules_when_installed() -> None:
    # PARITY_PROMTOOL may name one unpacked anywhere (e.g. from Debian's prometheus package with dpkg-deb -x)
    promtool = shutil.which(os.environ.get("PARITY_PROMTOOL", "promtool"))
    if promtool is None:
        import pytest

        pytest.skip("promtool is not installed; the YAML structure test above still runs")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
