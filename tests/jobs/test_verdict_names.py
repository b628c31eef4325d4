"""Every verdict name is defined once (jobs/verdict_names.py): no module in service/ or jobs/ spells one out
where it compares a verdict, lists verdicts, or names known-failure."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jobs.verdict_names import ERROR, FAIL, KNOWN_FAILURE, PASS, RUN_VERDICTS, VERDICTS

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


def spelled_out(source: str) -> list[str]:
    """Where a module spells a verdict name: compared against something named *verdict*, in a literal
    collection made only of verdict names, or known-failure anywhere but a docstring."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
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
    offenders = {str(p.relative_to(ROOT)): hits
                 for folder in ("service", "jobs") for p in sorted((ROOT / folder).rglob("*.py"))
                 if p != HOME and (hits := spelled_out(p.read_text()))}
    assert offenders == {}


def test_the_scan_finds_a_spelled_out_name_and_passes_a_named_one() -> None:
    bad = ('if run.verdict == "pass": pass\nGOOD = ("pass", "known-failure")\nx = r["verdict"] in {"fail"}\n'
           'label = "known-failure"\n')
    assert spelled_out(bad) == ["1: run.verdict == 'pass'", "2: 'known-failure'", "2: ('pass', 'known-failure')",
                                "3: r['verdict'] in {'fail'}", "4: 'known-failure'"]
    good = ('"""A known-failure docstring is prose."""\nif run.verdict == PASS: pass\n'
            'state = run.state in ("failed", "error")\nhelp = "a known-failure verdict exits 1"\n')
    assert spelled_out(good) == []
