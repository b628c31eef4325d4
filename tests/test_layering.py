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
SHARED = sorted(p for p in (ROOT / "jobs").glob("*.py") if p.name != "protocol.py")
# role folder (or the shared modules) -> the jobs.* modules and third-party roots it must not import
ROLE_RULES: dict[str, tuple[list[Path], set[str]]] = {
    "rank": (sorted((ROOT / "jobs" / "rank").rglob("*.py")), {"jobs.launch", "jobs.verdict"}),
    "verdict": (sorted((ROOT / "jobs" / "verdict").rglob("*.py")), {"jobs.launch", "jobs.rank", "torch", "megatron"}),
    "shared": (SHARED, {"jobs.launch", "jobs.rank", "jobs.verdict", "torch", "megatron"}),
    # the run protocol names the rank entry points it launches (imported lazily), nothing above it
    "protocol": ([ROOT / "jobs" / "protocol.py"], {"jobs.launch", "jobs.verdict", "torch", "megatron"}),
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
        "import sys, service.web.app, service.cli.main, service.scheduler.evaluation, service.scheduler.loop; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, f"importing the service imported: {out.stdout.strip()} {out.stderr[-2000:]}"


# service/ by feature: each slice may import only the slices listed (all import core/); nothing
# imports scheduler/ but the command line; web/ and cli/ sit on top. Listed once, so a new import
# between slices is a decision made here, not an accident (and a circle cannot form: the order is fixed).
SLICE_DEPENDENCIES: dict[str, set[str]] = {
    "core": set(),
    "executors": {"core"},
    "artifacts": {"core"},
    "environments": {"core", "executors", "artifacts"},
    "oncall": {"core"},
    "runs": {"core", "executors", "environments", "oncall"},
    "bisects": {"core", "environments", "runs"},
    "sweeps": {"core", "environments", "runs"},
    "suites": {"core", "environments", "runs", "oncall"},
    "selftest": {"core", "environments", "runs"},
    "tracks": {"core", "environments", "oncall", "runs", "bisects", "suites"},
    "scheduler": {"core", "executors", "artifacts", "environments", "oncall", "runs", "bisects", "sweeps",
                  "selftest", "tracks"},
    "web": {"core", "executors", "artifacts", "environments", "oncall", "runs", "bisects", "sweeps", "suites",
            "selftest", "tracks"},
    "cli": {"core", "executors", "artifacts", "environments", "oncall", "runs", "bisects", "sweeps", "suites",
            "selftest", "scheduler", "web", "tracks"},
}


def _slice_imports(path: Path) -> set[str]:
    return {m.split(".")[1] for m in _modules(path) if m.startswith("service.") and m.count(".") >= 1}


def test_every_service_module_lives_in_a_known_slice() -> None:
    stray = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "service").glob("*.py") if p.name != "__init__.py")
    folders = {p.name for p in (ROOT / "service").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert stray == [] and folders == set(SLICE_DEPENDENCIES)


@pytest.mark.parametrize("slice_name", sorted(SLICE_DEPENDENCIES))
def test_slices_import_only_the_slices_below_them(slice_name: str) -> None:
    allowed = SLICE_DEPENDENCIES[slice_name] | {slice_name}
    offenders = {
        str(p.relative_to(ROOT)): sorted(_slice_imports(p) - allowed)
        for p in (ROOT / "service" / slice_name).rglob("*.py")
        if _slice_imports(p) - allowed
    }
    assert offenders == {}


def test_the_slice_order_has_no_circle() -> None:
    seen: list[str] = []
    pending = dict(SLICE_DEPENDENCIES)
    while pending:
        ready = sorted(name for name, deps in pending.items() if deps <= set(seen))
        assert ready, f"circular slice dependencies among {sorted(pending)}"
        seen += ready
        for name in ready:
            del pending[name]


def test_the_slice_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from service.scheduler.loop import run\nfrom service.core.db import get_engine\n")
    assert _slice_imports(bad) - SLICE_DEPENDENCIES["runs"] - {"runs"} == {"scheduler"}


def test_no_module_is_imported_for_its_side_effect() -> None:
    # an unused import kept (and silenced) to register something hides a dependency; registration is a call
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / "service").rglob("*.py") if "F401" in p.read_text()
    ]
    assert offenders == []


def test_tests_share_code_only_through_the_plugins() -> None:
    """What several test folders share lives in tests/plugins/ (and the golden documents in tests/golden/):
    a test module never imports another test folder's module, so moving or deleting a test breaks no other."""
    allowed = ("tests.plugins", "tests.golden")
    sideways = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for name in _modules(path)
        if name.startswith("tests.") and not name.startswith(allowed)
    }
    assert not sideways, sorted(sideways)
