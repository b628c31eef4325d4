"""Scanning the project's own Python source for a name spelled out where its constant belongs
(tests/jobs/test_signature_names.py, test_verdict_names.py, test_verdict_label.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def docstring_ids(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants in tree (a module's, a class's or a function's): prose, not code."""
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def offenders(spelled_out: Callable[[str], list[str]], home: Path) -> dict[str, list[str]]:
    """{module: what spelled_out found in it} for every module of service/ and jobs/ but home (the constants')."""
    return {str(p.relative_to(ROOT)): hits
            for folder in ("service", "jobs") for p in sorted((ROOT / folder).rglob("*.py"))
            if p != home and (hits := spelled_out(p.read_text()))}
