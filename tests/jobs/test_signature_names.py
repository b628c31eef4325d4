"""Every signature name is defined once (jobs/signature_names.py): no module in service/ or jobs/ spells
one out (a string that is a signature's name, outside a docstring), and no page template or script does."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jobs import signature_names
from jobs.signature_names import SIGNATURE_IDS
from jobs.verdict.signatures import SIGNATURES
from tests.plugins.source_scan import docstring_ids, offenders

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "jobs" / "signature_names.py"
NAMES = frozenset(SIGNATURE_IDS)


def spelled_out(source: str) -> list[str]:
    """Where a module spells a signature name: any string constant (an f-string's text included) that is
    one, except a docstring."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    return sorted({f"{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and n.value in NAMES and id(n) not in docstrings})


def test_each_name_has_one_constant_and_every_signature_is_named() -> None:
    constants = {v: k for k, v in vars(signature_names).items() if k.isupper() and isinstance(v, str)}
    assert set(constants) == NAMES and len(constants) == len(SIGNATURE_IDS)
    assert all(constants[n] == n.upper().replace("-", "_") for n in NAMES)
    assert set(SIGNATURES) | {signature_names.UNSUPPORTED_BY_BUILD} >= NAMES


def test_no_module_spells_out_a_signature_name() -> None:
    assert offenders(spelled_out, HOME) == {}


def test_no_template_or_script_spells_out_a_signature_name() -> None:
    quoted = re.compile("['\"](" + "|".join(map(re.escape, sorted(NAMES))) + ")['\"]")
    files = sorted((ROOT / "service" / "web" / "dashboard").rglob("*.htm*")) + sorted(
        (ROOT / "service" / "web" / "dashboard").rglob("*.js"))
    assert files
    offenders = [f"{f.name}:{n}" for f in files for n, line in enumerate(f.read_text().splitlines(), 1)
                 if quoted.search(line)]
    assert offenders == []


def test_the_scan_finds_a_spelled_out_name_and_passes_a_named_one() -> None:
    bad = ('if sig == "adam-step-not-restored": pass\nCAUSES = {"optimizer-moments-mismatch": 1}\n'
           'msg = f"see {x} checkpoint-load-crash"\nname = f"{y}final-state-mismatch"\n')
    assert spelled_out(bad) == ["1: 'adam-step-not-restored'", "2: 'optimizer-moments-mismatch'",
                                "4: 'final-state-mismatch'"]
    good = ('"""adam-step-not-restored in a docstring is prose."""\nif sig == ADAM_STEP_NOT_RESTORED: pass\n'
            'text = "the adam step was not restored"\n')
    assert spelled_out(good) == []
