"""Every verdict name is defined once (jobs/verdict_names.py): no module in service/ or jobs/ spells one out
where it compares a verdict, lists verdicts, or names known-failure."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jobs.verdict_names import ERROR, FAIL, KNOWN_FAILURE, PASS, RUN_VERDICTS, VERDICTS
from tests.plugins.source_scan import docstring_ids, offenders

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "jobs" / "verdict_names.py"
NAMES = frozenset(RUN_VERDICTS)


def _strings(node: ast.AST) -> list[str]:
    """The string constants a comparison operand is: "pass", or ("fail", "error"), or {"pass"}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("frozenset", "set", "tuple") and node.args:
        return _strings(node.args[0])
    return []


def _given(node: ast.AST | None) -> list[ast.Constant]:
    """The verdict names a value is made of: "fail", FAIL if x else "pass", ("error", causes)."""
    if isinstance(node, ast.Constant):
        return [node] if node.value in NAMES else []
    if isinstance(node, ast.IfExp):
        return _given(node.body) + _given(node.orelse)
    if isinstance(node, ast.Tuple) and node.elts:
        return _given(node.elts[0])
    return []


def _gives_a_verdict(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return "Verdict" in (ast.unparse(fn.returns) if fn.returns else "") or any(
        w in fn.name.lower() for w in ("verdict", "overall", "outcome"))


def _given_verdicts(node: ast.AST) -> list[ast.Constant]:
    """Verdict names handed on as a verdict: assigned to or passed as *verdict*, keys of a *verdict* mapping,
    parity_result's first argument, or returned by a function that gives a verdict."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any("verdict" in ast.unparse(t).lower() for t in targets):
            if isinstance(node.value, ast.Dict):
                return [k for k in node.value.keys if isinstance(k, ast.Constant) and k.value in NAMES]
            return _given(node.value)
    if isinstance(node, ast.keyword) and node.arg and "verdict" in node.arg:
        return _given(node.value)
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("parity_result") and node.args:
        return _given(node.args[0])
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _gives_a_verdict(node):
        return [c for r in ast.walk(node) if isinstance(r, ast.Return) for c in _given(r.value)]
    return []


def spelled_out(source: str) -> list[str]:
    """Where a module spells a verdict name: compared against something named *verdict*, in a literal
    collection made only of verdict names, handed on as a verdict, or known-failure anywhere but a docstring."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any("verdict" in ast.unparse(o).lower() for o in operands) and any(
                    s in NAMES for o in operands for s in _strings(o)):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
            names = _strings(node)
            if len(names) == len(node.elts) and set(names) <= NAMES:
                out.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and node.value == KNOWN_FAILURE and id(node) not in docstrings:
            out.append(f"{node.lineno}: {node.value!r}")
        out += [f"{c.lineno}: {c.value!r}" for c in _given_verdicts(node)]
    return sorted(set(out))


TEMPLATE_COMPARISON = re.compile(r"verdict\s*(?:==|!=|in|not in)\s*\(?\s*['\"]")


def test_no_dashboard_template_compares_a_verdict_with_a_spelled_out_name() -> None:
    # the templates get PASS and FAILED as globals (service/web/dashboard/rendering.py)
    templates = sorted((ROOT / "service" / "web" / "dashboard" / "templates").glob("*.html"))
    assert templates
    offenders = [f"{t.name}:{n}" for t in templates for n, line in enumerate(t.read_text().splitlines(), 1)
                 if TEMPLATE_COMPARISON.search(line)]
    assert offenders == []
    assert TEMPLATE_COMPARISON.search("{% if r.verdict in ('fail', 'error') %}")
    assert not TEMPLATE_COMPARISON.search("{% if r.verdict in FAILED %}")


def test_the_names_and_their_types_agree() -> None:
    assert VERDICTS == (PASS, FAIL, ERROR)
    assert RUN_VERDICTS == (*VERDICTS, KNOWN_FAILURE)


def test_no_module_spells_out_a_verdict_name() -> None:
    assert offenders(spelled_out, HOME) == {}


def test_the_scan_finds_a_spelled_out_name_and_passes_a_named_one() -> None:
    bad = ('if run.verdict == "pass": pass\nGOOD = ("pass", "known-failure")\nx = r["verdict"] in {"fail"}\n'
           'label = "known-failure"\n')
    assert spelled_out(bad) == ["1: run.verdict == 'pass'", "2: 'known-failure'", "2: ('pass', 'known-failure')",
                                "3: r['verdict'] in {'fail'}", "4: 'known-failure'"]
    good = ('"""A known-failure docstring is prose."""\nif run.verdict == PASS: pass\n'
            'state = run.state in ("failed", "error")\nhelp = "a known-failure verdict exits 1"\n')
    assert spelled_out(good) == []


def test_the_scan_finds_a_verdict_handed_on_spelled_out() -> None:
    bad = ('verdict = "fail" if x else PASS\nr = parity_result("error", spec)\nf(verdict="pass")\n'
           'def overall(o):\n    return "error"\nV = {"fail": 1}\nverdict, why = "error", []\n')
    assert spelled_out(bad) == ["1: 'fail'", "2: 'error'", "3: 'pass'", "5: 'error'", "7: 'error'"]
    good = ('verdict = FAIL if lane["tolerance"]["pass"] else PASS\ndef status():\n    return "error"\n'
            'doc = {"status": "error"}\n')
    assert spelled_out(good) == []
