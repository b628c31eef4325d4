"""The layering CONTRIBUTING.md promises: jobs/ never reaches the service or the database; models/ is leaf;
inside jobs/ the role folders only point down (launch -> rank, verdict -> shared), and what the service
imports of jobs/ (the verdict and the shared modules) never imports torch or Megatron."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "jobs": {"service", "models", "sqlalchemy", "psycopg", "fastapi", "pydantic"},
    "models": {"service", "jobs"},
}
SHARED = sorted(p for p in (ROOT / "jobs").glob("*.py"))
# role folder (or the shared modules) -> the jobs.* modules and third-party roots it must not import
ROLE_RULES: dict[str, tuple[list[Path], set[str]]] = {
    "rank": (sorted((ROOT / "jobs" / "rank").rglob("*.py")), {"jobs.launch", "jobs.verdict"}),
    "verdict": (sorted((ROOT / "jobs" / "verdict").rglob("*.py")), {"jobs.launch", "jobs.rank", "torch", "megatron"}),
    "shared": (SHARED, {"jobs.launch", "jobs.rank", "jobs.verdict", "torch", "megatron"}),
}


def _modules(path: Path) -> set[str]:
    """Every absolute module a file imports (also inside functions), as dotted names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules(path)}


def _hits(path: Path, banned: set[str]) -> list[str]:
    return sorted(m for m in _modules(path) for b in banned if m == b or m.startswith(b + "."))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layers(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
        if _imports(path) & FORBIDDEN[package]
    }
    assert offenders == {}


@pytest.mark.parametrize("role", sorted(ROLE_RULES))
def test_role_folders_only_import_downwards(role: str) -> None:
    paths, banned = ROLE_RULES[role]
    assert paths, f"no modules found for {role}"
    offenders = {str(p.relative_to(ROOT)): hits for p in paths if (hits := _hits(p, banned))}
    assert offenders == {}


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from jobs.launch.local import run_parity\n    import torch.nn\n")
    assert _hits(bad, {"jobs.launch", "torch"}) == ["jobs.launch.local", "jobs.launch.local.run_parity", "torch.nn"]


def test_importing_the_service_does_not_import_torch() -> None:
    # A fresh interpreter: the API and the CLI must start without paying for (or needing) torch/Megatron.
    code = (
        "import sys, service.web.app, service.cli.main, service.runs.evaluation, service.scheduler.loop; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, f"importing the service imported: {out.stdout.strip()} {out.stderr[-2000:]}"
