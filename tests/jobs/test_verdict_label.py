"""A verdict's label is composed in one place (jobs/verdict_label.py): the job's label, the service's
reading and the client's fallback all call it, and no other module spells a label's qualifier."""

from __future__ import annotations

import ast
from pathlib import Path

from jobs.verdict_label import label, qualifiers, verdict_label
from jobs.verdict_names import FAIL, KNOWN_FAILURE, PASS
from tests.plugins.source_scan import docstring_ids, offenders

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "jobs" / "verdict_label.py"
# how each qualifier of a label begins
QUALIFIERS = ("worked around", "regression against", "regression on", "regresses against")


def spelled_out(source: str) -> list[str]:
    """Where a module writes a label's qualifier itself: a string (or an f-string's text) that begins with one,
    outside a docstring."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    return sorted({f"{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                   and n.value.lstrip(" (").startswith(QUALIFIERS)})


def test_no_module_composes_a_label_of_its_own() -> None:
    assert offenders(spelled_out, HOME) == {}


def test_the_scan_finds_a_qualifier_and_passes_a_call() -> None:
    bad = ('label = f"{v} (worked around: {by})"\ntext = "regresses against main"\nx = f"{v} (regression on {t})"\n')
    assert spelled_out(bad) == ["1: ' (worked around: '", "2: 'regresses against main'", "3: ' (regression on '"]
    good = '"""A pass (worked around) reads so."""\nlabel = label(v, qualifiers(v, worked_around_by=by))\n'
    assert spelled_out(good) == []


def test_the_labels_read_as_before() -> None:
    by = {"restore-adam-step": ["adam-step-not-restored"], "realign-param-index": ["optimizer-state-mismatch"]}
    assert verdict_label(PASS, by) == "pass (worked around: realign-param-index, restore-adam-step)"
    assert verdict_label(PASS, ["adam-step-not-restored"]) == "pass (worked around)"
    assert verdict_label(PASS, {}, "reshard: loss 3e-05") == "pass [reshard: loss 3e-05]"
    assert verdict_label(FAIL, by) == "fail" and verdict_label(None, by) is None
    assert label(KNOWN_FAILURE, qualifiers(KNOWN_FAILURE, known_signatures=["adam-step-not-restored"],
                                           regression=("pr-1", "main"))) \
        == "known-failure (known upstream bug: adam-step-not-restored; regression against main)"
    assert label(FAIL, qualifiers(FAIL, regression=("main", None))) == "fail (regression on main)"
