"""docs/lifecycle.md's map is the one the state machine and the code that moves runs give."""

from __future__ import annotations

from service.core.run_state import TERMINAL
from service.runs import lifecycle_map


def test_the_documented_map_is_the_generated_one() -> None:
    regenerate = ".venv/bin/python -m service.runs.lifecycle_map --write docs/lifecycle.md"
    assert lifecycle_map.documented() == lifecycle_map.markdown(), f"docs/lifecycle.md is stale: {regenerate}"


def test_every_final_state_runs_the_handlers_and_is_entered_from_somewhere() -> None:
    rows = {line.split("|")[1].strip(" `"): line for line in lifecycle_map.markdown().splitlines()
            if line.startswith("| `")}
    for state in TERMINAL:
        assert "on_check_ended" in rows[state.value], state
    assert lifecycle_map.movers()["error"] >= {"service/scheduler/row_guard.py", "service/scheduler/submitter.py"}
