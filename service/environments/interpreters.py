"""Which Pythons builds may use, and which one a requirement set needs.

Megatron-Core 0.17 and later declare `Requires-Python >=3.12`; the service itself runs on 3.11.
A build's venv is made on the lowest configured Python that every requirement line's
Requires-Python accepts. The configured set is PARITY_PYTHONS (`3.11=/usr/bin/python3.11,3.12=…`)
or, unset, every `python3.X` found on PATH (pyenv shims with no version selected do not run:
then pyenv's own versions folder is looked at). The service's own Python is always in the set, and
none older: jobs/ runs inside every build and is written for the service's Python (3.11) and later,
and a build falling to 3.10 would need a torch of its own where 3.11 shares the service's.

Requires-Python is read from the packages' own metadata (an index's, a wheel's, a source tree's),
through pip's installation report, inside the build job: never a table of releases kept here.
Only the named lines are read (`--no-deps`); a dependency with a narrower Requires-Python still
makes the installer fail with its own message. Lines that are all wheel files (an uploaded wheel)
are read from the wheels themselves, with their tags matched to each Python, without starting pip.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging import tags
from packaging.metadata import parse_email
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

VERSION = re.compile(r"^3\.[0-9]{1,2}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._+\-/]{1,999}$")
PROBE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
PROBE_TIMEOUT_S = 30
DISCOVER_MINORS = range(sys.version_info.minor, 20)
UNREADABLE = "reading Requires-Python of the requirements failed"


class PythonsError(ValueError):
    """PARITY_PYTHONS is malformed or names an interpreter that does not run as the version it claims."""


class NoPythonFits(RuntimeError):
    """No configured Python satisfies every requirement's Requires-Python; the message names both sides."""


class MetadataUnreadable(RuntimeError):
    """pip could not read the requirements' metadata (no such version, no index, a tree that does not build)."""


def own_python() -> tuple[str, str]:
    """(X.Y, interpreter) of the service itself: the base interpreter, never a venv's wrapper."""
    return f"{sys.version_info.major}.{sys.version_info.minor}", getattr(sys, "_base_executable", sys.executable)


def probe(python: str) -> str | None:
    """The full version (3.12.1) `python` runs as, or None when it does not run."""
    try:
        proc = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and re.fullmatch(r"3\.[0-9]+\.[0-9]+", out) else None


def parse(value: str) -> dict[str, str]:
    """PARITY_PYTHONS as {X.Y: path}; each interpreter is run once to check it is that version."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        version, sep, path = (s.strip() for s in item.partition("="))
        if not sep or not VERSION.match(version) or not SAFE_PATH.match(path):
            raise PythonsError(
                f"PARITY_PYTHONS: {item[:200]!r} is not X.Y=/absolute/path/to/python "
                "(e.g. 3.12=/usr/bin/python3.12; items separated by commas)")
        if Version(version) < Version(own_python()[0]):
            raise PythonsError(f"PARITY_PYTHONS: {version} is older than the service's Python {own_python()[0]} "
                               "(jobs/ runs inside every build; allowed: that version or later)")
        found = probe(path)
        if found is None or not found.startswith(version + "."):
            raise PythonsError(
                f"PARITY_PYTHONS: {path!r} for {version} runs as {found or 'nothing (it does not run)'}")
        out[version] = path
    return out


def _pyenv_candidates(minor: int) -> list[str]:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    # newest patch first: 3.12.10 before 3.12.9
    found = sorted(root.glob(f"3.{minor}.*/bin/python3.{minor}"),
                   key=lambda p: Version(p.parent.parent.name) if re.fullmatch(r"[0-9.]+", p.parent.parent.name)
                   else Version("0"), reverse=True)
    return [str(p) for p in found]


def discover() -> dict[str, str]:
    """Every python3.X that runs: on PATH first, else in pyenv's versions folder."""
    out: dict[str, str] = {}
    for minor in DISCOVER_MINORS:
        candidates = [p for p in [shutil.which(f"python3.{minor}")] if p] + _pyenv_candidates(minor)
        for path in candidates:
            real = os.path.realpath(path)
            if SAFE_PATH.match(real) and (probe(real) or "").startswith(f"3.{minor}."):
                out[f"3.{minor}"] = real
                break
    return out


@functools.cache
def configured(value: str | None) -> dict[str, str]:
    """The Pythons builds may use, {X.Y: interpreter}, lowest version first; the service's own always in it."""
    pythons = parse(value) if value else discover()
    version, path = own_python()
    if not value or version not in pythons:  # discovery may have found a shim for it: the service's own is exact
        pythons[version] = path
    return dict(sorted(pythons.items(), key=lambda kv: Version(kv[0])))


def versions_key(pythons: dict[str, str]) -> str:
    """What a build's content hash records of the set: the versions (the choice depends on them, not on paths)."""
    return ",".join(pythons)


def requires_python(installs: list[str], python: str, log: Path) -> list[tuple[str, str, str]]:
    """(name, version, Requires-Python) of what each line installs, from pip's report (metadata, --no-deps).

    pip runs as `python` (so wheels are picked for its tags) but ignores Requires-Python, to read it.
    """
    report = log.parent / "requires-python.json"
    cmd = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", "install", "--dry-run",
           "--no-deps", "--ignore-requires-python", "--quiet", "--report", str(report), *installs]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800, env=env)
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n{proc.stdout}exit {proc.returncode}\n")
    if proc.returncode != 0:
        tail = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("WARNING: Location"))
        raise MetadataUnreadable(
            f"{UNREADABLE} (exit {proc.returncode}):\n{tail[-3000:]}")
    doc = json.loads(report.read_text())
    out = []
    for item in doc.get("install", []):
        meta = item.get("metadata", {})
        out.append((str(meta.get("name", "?")), str(meta.get("version", "?")), str(meta.get("requires_python") or "")))
    return out


def wheel_requires_python(wheel: Path) -> tuple[str, str, str]:
    """(name, version, Requires-Python) from a wheel's own METADATA (read as data, nothing run)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise MetadataUnreadable(f"{UNREADABLE}: {wheel.name} holds not one .dist-info/METADATA")
            raw, _ = parse_email(zf.read(names[0])[: 1 << 20])
    except (OSError, zipfile.BadZipFile) as exc:
        raise MetadataUnreadable(f"{UNREADABLE}: {wheel.name} is not a readable wheel ({exc})") from None
    return str(raw.get("name", "?")), str(raw.get("version", "?")), str(raw.get("requires_python") or "")


def wheel_fits(wheel: Path, version: str) -> bool:
    """Whether Python X.Y on this machine installs `wheel` (a tag of its file name is one that Python supports)."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return False
    python = tuple(int(part) for part in version.split("."))
    supported = {*tags.cpython_tags(python_version=python), *tags.compatible_tags(python_version=python)}
    return not wheel_tags.isdisjoint(supported)


def choose(found: list[tuple[str, str, str]], pythons: dict[str, str]) -> tuple[str, str]:
    """(X.Y, interpreter): the lowest configured Python every Requires-Python in `found` accepts."""
    specs = []
    for name, version, spec in found:
        try:
            specs.append((name, version, spec, SpecifierSet(spec)))
        except InvalidSpecifier:
            raise NoPythonFits(f"{name} {version}: Requires-Python {spec!r} is not a valid specifier") from None
    for version, path in pythons.items():
        # the lowest patch of X.Y: '>=3.12' accepts every 3.12.z, '>=3.12.4' only a 3.12 of that patch or later
        full = probe(path) or f"{version}.0"
        if all(s.contains(full, prereleases=True) for *_, s in specs):
            return version, path
    needs = "; ".join(f"{n} {v} has Requires-Python {s!r}" for n, v, s, spec in specs if str(spec))
    have = ", ".join(f"{v} ({p})" for v, p in pythons.items())
    raise NoPythonFits(
        f"requirements: no configured Python fits the Requires-Python field ({needs}); "
        f"the Pythons configured (PARITY_PYTHONS) are {have}")
