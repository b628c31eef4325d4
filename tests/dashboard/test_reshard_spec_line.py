"""The spec summary on the run page (and wherever a spec is summarised) says where a resharded run resumed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from service.web.dashboard.rendering import templates
from service.web.dashboard.runpage import tolerance_of

SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3, "sharding": "dp_reshardable",
        "workarounds": ["realign-param-index"]}


def _spec_line(spec: dict[str, Any]) -> str:
    macro = templates.env.from_string('{% from "_macros.html" import spec_line %}{{ spec_line(spec) }}')
    return macro.render(spec=spec)


def test_spec_line_names_the_resume_dp_only_when_set() -> None:
    assert "resumed at DP" not in _spec_line(SPEC)
    line = _spec_line({**SPEC, "resume_dp": 1})
    assert "dp=2" in line and "resumed at DP 1" in line


def test_run_page_tolerance_is_the_reshard_profile_for_a_resharded_run() -> None:
    def run(**spec: Any) -> Any:
        return cast(Any, SimpleNamespace(spec={**SPEC, **spec}))

    assert tolerance_of(run(tolerance="exact")).name == "exact"  # type: ignore[union-attr]
    # the profile measured for this config and direction (jobs/calibration/reshard.json)
    assert tolerance_of(run(tolerance="exact", resume_dp=1)).name == "reshard:moe-fp32-router:2->1@3"  # type: ignore[union-attr]
    assert tolerance_of(run(tolerance="loose", resume_dp=1)).name == "loose"  # type: ignore[union-attr]
