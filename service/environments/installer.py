"""What fills a build's venv: uv (the service extra's `uv` package), or pip where uv is not installed.

uv makes the venv and installs into it in a fraction of pip's time (benchmarks/env_build.py). Both
run under the same rules: no configuration file is read (uv: `--no-config` and UV_NO_CONFIG=1;
pip: PIP_CONFIG_FILE=/dev/null from service/executors/job_home.py), their cache is the job's
private one (XDG_CACHE_HOME / PIP_CACHE_DIR inside its folder), and the indexes they reach are the
ones pip was given by PIP_* variables (translated for uv here, since uv reads no PIP_* variable),
so a build reaches no index that pip would not have.

uv only counts as installed what lies in the venv's own site-packages (pip also reads the `.pth`
that points at the shared torch): every shared distribution gets a *stub* there, its METADATA and
a RECORD naming only the stub's own files. A requirement that upgrades a shared distribution
removes just the stub and installs the new one into the venv, never touching the shared files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

STUB_INSTALLER = "parity-shared"


def uv_binary() -> str | None:
    """The uv executable installed with the service, or None (then builds use pip)."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return None


def uv_environment(environ: dict[str, str]) -> dict[str, str]:
    """The variables uv runs with: no configuration, no Python downloads, pip's timeout and CA bundle."""
    env = {**environ, "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    if "PIP_DEFAULT_TIMEOUT" in environ and "UV_HTTP_TIMEOUT" not in environ:
        env["UV_HTTP_TIMEOUT"] = environ["PIP_DEFAULT_TIMEOUT"]
    if "PIP_CERT" in environ and "SSL_CERT_FILE" not in environ:
        env["SSL_CERT_FILE"] = environ["PIP_CERT"]
    return env


def index_flags(environ: dict[str, str]) -> list[str]:
    """pip's index options (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX) as uv flags."""
    flags: list[str] = []
    if environ.get("PIP_INDEX_URL"):
        flags += ["--index-url", environ["PIP_INDEX_URL"]]
    for url in environ.get("PIP_EXTRA_INDEX_URL", "").split():
        flags += ["--extra-index-url", url]
    for place in environ.get("PIP_FIND_LINKS", "").split():
        flags += ["--find-links", place]
    if environ.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    return flags


def venv_command(uv: str | None, interpreter: str, venv: Path) -> list[str]:
    """Create (or empty) the venv on `interpreter`, with no installer inside it."""
    if uv:
        return [uv, "venv", "--no-config", "--quiet", "--clear", "--no-python-downloads", "--python", interpreter,
                str(venv)]
    return [interpreter, "-m", "venv", "--clear", "--without-pip", str(venv)]


def install_command(uv: str | None, python: Path, constraints: Path, installs: list[str],
                    environ: dict[str, str]) -> list[str]:
    """Install `installs` into the venv of `python` under the torch constraint.

    Both write the bytecode of what they install (pip by default, uv with --compile-bytecode): the build
    imports nothing (its first warm worker does), and the venv is the build's to write only now.
    """
    if uv:
        return [uv, "pip", "install", "--no-config", "--compile-bytecode", "--python", str(python),
                *index_flags(environ), "--constraint", str(constraints), *installs]
    return [*_pip(python), "install", "--no-input", "--constraint", str(constraints), *installs]


def freeze_command(uv: str | None, python: Path) -> list[str]:
    """List what the venv holds (the shared distributions through their stubs), `name==version` per line."""
    if uv:
        return [uv, "pip", "freeze", "--quiet", "--no-config", "--python", str(python)]
    return [*_pip(python), "freeze", "--all"]


def _pip(python: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]


def stub_distributions(shared: Path, site: Path) -> int:
    """Give every distribution in `shared` a stub in `site` (METADATA, INSTALLER, a RECORD of the stub
    alone) so an installer sees it as installed; returns how many."""
    made = 0
    for info in sorted(shared.glob("*.dist-info")):
        metadata = info / "METADATA"
        if not metadata.is_file():
            continue
        stub = site / info.name
        if stub.exists():
            shutil.rmtree(stub)
        stub.mkdir()
        shutil.copyfile(metadata, stub / "METADATA")
        (stub / "INSTALLER").write_text(f"{STUB_INSTALLER}\n")
        (stub / "RECORD").write_text("".join(f"{info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")))
        made += 1
    return made
