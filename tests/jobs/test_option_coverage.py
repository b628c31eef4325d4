"""Every setting a production-recipe config switches on has a pull request that breaks its resume, or a reason.

Static (no build): the table in jobs/selftest/option_coverage.py against the recipe configs, the injected pull
requests and the gate. That each PR fails its check alone is benchmarks/injected_prs.py --own-check's (the
nightly's tests/service/test_gate_on_main.py runs a slice).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from jobs import features
from jobs.configs import CONFIGS
from jobs.selftest import option_coverage
from jobs.selftest.pull_requests import BY_NAME, GATED
from jobs.spec import RunSpec

ROOT = Path(__file__).resolve().parents[2]


def _gate() -> dict[str, RunSpec]:
    checks = yaml.safe_load((ROOT / "suites" / "gate.yaml").read_text())["checks"]
    return {c["name"]: RunSpec(**c["spec"]) for c in checks}


def test_every_recipe_setting_has_a_pull_request_or_a_reason() -> None:
    missing = option_coverage.recipe_settings() - set(option_coverage.OPTION_PULL_REQUESTS)
    assert not missing, f"recipe settings with neither an injected PR nor a reason: {sorted(missing)}"
    stale = set(option_coverage.OPTION_PULL_REQUESTS) - option_coverage.recipe_settings()
    assert not stale, f"settings no recipe config switches on any more: {sorted(stale)}"


def test_each_named_pull_request_is_gated_and_its_check_switches_the_setting_on() -> None:
    gate = _gate()
    gated = {pr.name for pr in GATED}
    for setting in option_coverage.OPTION_PULL_REQUESTS:
        names = option_coverage.pull_requests_for(setting)
        if not names:
            assert len(str(option_coverage.OPTION_PULL_REQUESTS[setting])) > 40, setting  # a reason, written out
            continue
        for name in names:
            assert name in gated, f"{setting}: {name} is not a gated pull request"
            check = BY_NAME[name].check
            exercising = {c for c, spec in gate.items() if f"megatron:{setting}" in features.spec_features(spec)}
            assert exercising, f"{setting}: no gate check switches it on"
            if check:
                assert check in exercising, f"{setting}: {name}'s check {check} does not switch it on"


def test_a_setting_a_recipe_newly_switches_on_is_caught_by_the_table(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The table is read from the configs: a recipe that turns one more setting on fails the first test."""
    original = type(CONFIGS["gpt-recipe"]).megatron_settings
    monkeypatch.setattr(type(CONFIGS["gpt-recipe"]), "megatron_settings",
                        property(lambda self: {**original.fget(self), "new_option": 1}))  # type: ignore[attr-defined]
    assert "new_option" in option_coverage.recipe_settings() - set(option_coverage.OPTION_PULL_REQUESTS)


def test_the_documented_option_table_is_the_generated_one() -> None:
    from jobs import surface_table

    documented = surface_table.table_in(surface_table.DOC.read_text(), surface_table.OPTIONS_MARKERS)
    regenerate = ".venv/bin/python -m jobs.surface_table --write docs/detection.md"
    assert documented == option_coverage.markdown(), f"the option table is stale: {regenerate}"
