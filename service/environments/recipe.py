"""Build one environment: a virtualenv on the Python its requirements need, with a shared torch.

The job payload (`build_environment`) runs under submitit (local or Slurm) with the service's
Python and no database. Torch is never downloaded: the venv gets a `.pth` pointing at a folder
of symlinks to the service's installed torch (and the jobs package's runtime needs), and a stub
of each of them in its site-packages (installer.py), so the installer (uv; pip where uv is not
installed) sees them as installed and a constraint pins torch to that version. Requirements
installed into the venv shadow the shared ones (site-packages comes before `.pth` entries), and
an upgrade removes only a stub, never the shared files. The figures (uv against pip) are in
docs/measurements.md (benchmarks/env_build.py).

The Python is the lowest configured one that every line's Requires-Python accepts
(interpreters.py); on a Python other than the service's, the shared torch is that Python's base
venv (python_base.py), built once and shared by every build on it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from service.environments import installer, interpreters
from service.environments.python_base import ensure_base
from service.environments.requirements import SKIP_PARTS, local_source_digest

# What every environment shares with the service: torch (pinned) and what jobs/ imports besides it.
SHARED_DISTRIBUTIONS = ("torch", "submitit", "psutil", "numpy", "packaging")
PIP_TIMEOUT_S = 1800
# The build imports nothing it installed: its first warm worker imports torch and Megatron-Core anyway, and
# is its import check (service/runs/import_check.py); the build's document says so ("import_check":
# "pending"). What a build checks itself: the installer's package list, read back from the venv's own
# metadata (a Megatron-Core distribution, torch at the service's version). The bytecode of what it
# installed is written now, while the venv is the build's to write (the workers' users cannot).
MEGATRON_CORE = "megatron-core"


class BuildFailed(RuntimeError):
    """The installer failed, or installed no Megatron-Core or another torch; the message says which."""


def closure(names: tuple[str, ...] = SHARED_DISTRIBUTIONS) -> list[md.Distribution]:
    """The installed distributions `names` need, following their unconditional requirements."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional dependency the service itself does not have
        seen[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def link_shared(dest: Path) -> list[str]:
    """Fill dest with symlinks to the top-level entries of the shared distributions; return their pins."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = []
    for dist in closure():
        pins.append(f"{dist.metadata['Name']}=={dist.version}")
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")} - {"__pycache__"}
        for top in sorted(tops):
            src, link = site / top, dest / top
            if src.exists() and not link.exists():
                link.symlink_to(src)
    return pins


def _run(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> str:
    # The service's own PYTHONPATH (this checkout) must not leak into what pip sees as installed.
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}
    with log.open("a") as fh:
        t0 = time.time()
        fh.write(f"\n[{time.strftime('%H:%M:%S')}] $ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=PIP_TIMEOUT_S, env=env
        )
        fh.write(proc.stdout)
        fh.write(f"[{time.strftime('%H:%M:%S')}] exit {proc.returncode} after {time.time() - t0:.1f}s\n")
    if proc.returncode != 0:
        tail = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("WARNING: Location"))
        raise BuildFailed(f"{what} failed (exit {proc.returncode}):\n{tail[-4000:]}")
    return proc.stdout


def artifacts_folder(build_folder: Path) -> Path:
    """Uploaded artifacts: <run folder>/artifacts/<sha256>/<name>.whl (builds are in <run folder>/environments)."""
    return build_folder.parent.parent / "artifacts"


def resolve_line(line: str, root: Path, log: Path) -> str:
    """What pip installs for a line: local paths checked and hashed here (in the job, never in the API),
    artifact:<sha256> resolved to its wheel, whose content must have that hash."""
    if line.startswith("/"):
        source = Path(line)
        try:
            if source.is_dir():
                # pip builds a tree in place (egg-info, build/): a copy inside this build's folder is one
                # the job may write (it runs as PARITY_JOB_USER, the tree is the admin's), and what is
                # hashed is exactly what pip installs
                source = _copy_tree(source, root / "sources" / source.name)
            digest = local_source_digest(source)
        except (OSError, ValueError, shutil.Error) as exc:
            raise BuildFailed(f"{line}: {exc}") from None
        with log.open("a") as fh:
            fh.write(f"local source {line}: sha256 {digest}\n")
        return str(source)
    if line.startswith("artifact:"):
        sha = line.split(":", 1)[1]
        wheels = sorted((artifacts_folder(root) / sha).glob("*.whl"))
        if len(wheels) != 1 or wheels[0].is_symlink():
            raise BuildFailed(f"{line}: no single uploaded wheel under artifacts/{sha}")
        if _sha256(wheels[0]) != sha:
            raise BuildFailed(f"{line}: the wheel's content does not have that sha256")
        return str(wheels[0])
    return line


def _copy_tree(source: Path, dest: Path) -> Path:
    if not (source / "pyproject.toml").is_file() and not (source / "setup.py").is_file():
        return source  # local_source_digest says what is wrong with it
    if dest.exists():
        shutil.rmtree(dest)
    # links copied as links: a link out of the tree reaches only what the job user may read anyway
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(*SKIP_PARTS, "*.egg-info"))
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


RESULT_NAME = "build.json"


def build_environment(folder: str, requirements: list[str], pythons: dict[str, str] | None = None,
                      use_uv: bool = True) -> dict[str, Any]:
    """The build job: build the environment and leave its outcome in folder/build.json (JSON, never a pickle).

    The scheduler reads that document as data (build_steps.read_build_result); what the job returns
    is only for a caller running it in place.
    """
    root = Path(folder)
    try:
        doc = _build(root, requirements, pythons or dict([interpreters.own_python()]), use_uv)
    except Exception as exc:  # pip's output tail, or why the venv could not be made
        _write_result(root, {"error": f"{type(exc).__name__}: {exc}"[-6000:]})
        raise
    _write_result(root, doc)
    return doc


def _write_result(root: Path, doc: dict[str, Any]) -> None:
    tmp = root / f".{RESULT_NAME}.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(root / RESULT_NAME)


def pick_python(installs: list[str], pythons: dict[str, str], log: Path) -> tuple[str, str]:
    """(X.Y, interpreter) for these install arguments: read their Requires-Python (as the lowest Python whose
    pip can read them all: a wheel only built for cp312 is not found by 3.11's tags), then choose."""
    if installs and all(line.endswith(".whl") and Path(line).is_file() for line in installs):
        return _pick_for_wheels([Path(line) for line in installs], pythons, log)
    errors = []
    for python in pythons.values():
        try:
            found = interpreters.requires_python(installs, python, log)
        except interpreters.MetadataUnreadable as exc:
            errors.append(str(exc))
            continue
        _log_requires(found, log)
        return interpreters.choose(found, pythons)
    raise interpreters.MetadataUnreadable(errors[0])  # pip's reason under the lowest Python


def _pick_for_wheels(wheels: list[Path], pythons: dict[str, str], log: Path) -> tuple[str, str]:
    """The wheel files' own Requires-Python, among the Pythons whose tags every wheel matches."""
    found = [interpreters.wheel_requires_python(wheel) for wheel in wheels]
    _log_requires(found, log)
    fitting = {v: p for v, p in pythons.items() if all(interpreters.wheel_fits(w, v) for w in wheels)}
    if not fitting:
        raise interpreters.NoPythonFits(
            f"requirements: no configured Python (PARITY_PYTHONS: {', '.join(pythons)}) installs "
            f"{', '.join(w.name for w in wheels)}: its tags name another Python or platform")
    return interpreters.choose(found, fitting)


def _log_requires(found: list[tuple[str, str, str]], log: Path) -> None:
    with log.open("a") as fh:
        fh.write("".join(f"Requires-Python of {n} {v}: {s or '(none)'}\n" for n, v, s in found))


def base_pins(pins: list[str]) -> list[str]:
    """What a base venv on another Python installs: the shared distributions at the service's versions,
    torch without its local label (PyPI's 2.13.0 for the CPU wheel's 2.13.0+cpu)."""
    top = {n.lower() for n in SHARED_DISTRIBUTIONS}
    return [p.split("+", 1)[0] for p in pins if p.split("==", 1)[0].lower() in top]


def _build(root: Path, requirements: list[str], pythons: dict[str, str], use_uv: bool = True) -> dict[str, Any]:
    """Create root/venv on the Python the requirements need, with a shared torch; return its python and packages.

    use_uv=False builds with pip alone (what benchmarks/env_build.py compares); uv is also left out
    when it is not installed.
    """
    t0 = time.time()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    venv, shared = root / "venv", root / "shared"
    python = venv / "bin" / "python"
    uv = installer.uv_binary() if use_uv else None
    with log.open("a") as fh:
        fh.write(f"installer: {'uv ' + uv if uv else 'pip'}\n")
    installs = [resolve_line(line, root, log) for line in requirements]
    version, interpreter = pick_python(installs, pythons, log)
    _run(installer.venv_command(uv, interpreter, venv), log, f"creating the virtualenv on Python {version}")
    if version == interpreters.own_python()[0]:
        pins = link_shared(shared)
    else:
        pins = base_pins([f"{d.metadata['Name']}=={d.version}" for d in closure()])
        shared = ensure_base(root.parent, version, interpreter, pins, _run, log)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "_parity_shared.pth").write_text(f"{shared}\n")
    installer.stub_distributions(shared, site)  # what uv sees as installed (it reads no .pth)
    # The torch pin is what keeps a requirement from pulling another torch (a multi-GB download).
    constraints = root / "constraints.txt"
    constraints.write_text("".join(f"{p}\n" for p in pins if p.lower().startswith("torch==")))
    environ = installer.uv_environment(dict(os.environ)) if uv else dict(os.environ)
    _run(installer.install_command(uv, python, constraints, installs, environ), log, "installing the requirements",
         environ)
    freeze = _run(installer.freeze_command(uv, python), log, "listing the installed packages", environ)
    versions = installed_versions(site)
    torch_pin = next(p.split("==", 1)[1] for p in pins if p.lower().startswith("torch=="))
    found_torch = versions.get("torch", "")
    if found_torch.split("+")[0] != torch_pin.split("+")[0]:
        raise BuildFailed(f"torch {found_torch or '(none)'} in the build, expected the service's {torch_pin}")
    if MEGATRON_CORE not in versions:
        raise BuildFailed(f"the requirements installed no {MEGATRON_CORE} distribution (installed: "
                          f"{', '.join(sorted(versions))[:1000]})")
    return {
        "python": str(python),
        "python_version": interpreters.probe(str(python)) or version,
        "freeze": sorted(line for line in freeze.splitlines() if line.strip()),
        "torch": found_torch,
        "megatron_core": versions[MEGATRON_CORE],
        "import_check": "pending",
        "seconds": round(time.time() - t0, 2),
        "log": str(log),
        "installer": "uv" if uv else "pip",
    }


def installed_versions(site: Path) -> dict[str, str]:
    """{normalized name: version} of every distribution in a venv's site-packages (the stubs of the shared
    ones included), read from their metadata files: nothing the build installed is imported."""
    found: dict[str, str] = {}
    for dist in md.distributions(path=[str(site)]):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(name.lower().replace("_", "-").replace(".", "-"), str(dist.version))
    return found
