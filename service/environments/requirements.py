"""Requirement lines a build accepts, and the content hash that lets identical sets share one build.

A line is one of: a PEP 508 requirement (`megatron-core==0.15.3`), an absolute path to a local
wheel or source directory (admin tokens only), `git+https://…@<commit sha>`, or `artifact:<sha256>`
(a wheel or sdist uploaded to POST /api/v1/artifacts, named by its hash; `requirement_kind` tells the
kinds apart for the permission rules). Pip options (`-e`, `--index-url`, …) are refused: the build
decides how pip runs. Who may use which kind of line: service/environments/build_policy.py.

A local path is only checked for its shape here: the API never stats, opens or reads it (reading a
tree into the API's memory to hash it, or saying "not a wheel" about /etc/shadow, was the issue).
The build job checks and hashes it (`local_source_digest`), so a set with a local path is never
reused: each request builds afresh and the job logs what it hashed.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from service.artifacts.lines import ARTIFACT_LINE, ARTIFACT_PREFIX, artifact_sha

__all__ = ["ARTIFACT_PREFIX", "RequirementError", "artifact_sha", "content_hash", "normalize", "requirement_kind"]
# Bump when the build recipe changes what an environment contains: old builds stop being reused.
RECIPE_VERSION = "1"
MAX_LINES = 32
MAX_LINE_LENGTH = 500
ARTIFACT = re.compile(r"^artifact:[0-9a-f]{64}$")
GIT_URL = re.compile(r"^git\+https://[A-Za-z0-9._~:/%\-]+@[0-9a-f]{7,40}(#egg=[A-Za-z0-9_.\-]+)?$")
# Source trees carry caches and build output that do not change what gets installed.
SKIP_PARTS = {"__pycache__", ".git", "build", "dist", ".eggs"}


class RequirementError(ValueError):
    """A requirement line that cannot be built; names the line and what is allowed."""

    def __init__(self, index: int, message: str) -> None:
        self.field = f"requirements[{index}]"
        super().__init__(
            f"{self.field}: {message}; allowed: a requirement such as megatron-core==0.15.3, an absolute "
            "path to a local wheel or source directory, git+https://HOST/REPO@<commit sha>, or artifact:<sha256> "
            "of an uploaded wheel/sdist"
        )


def normalize(lines: list[str]) -> list[str]:
    """Validate requirement lines and return them stripped, de-duplicated and sorted."""
    if not isinstance(lines, list) or not lines:
        raise RequirementError(0, "at least one requirement line is needed")
    if len(lines) > MAX_LINES:
        raise RequirementError(MAX_LINES, f"at most {MAX_LINES} lines")
    out = []
    for i, raw in enumerate(lines):
        if not isinstance(raw, str):
            raise RequirementError(i, f"must be a string, got {type(raw).__name__}")
        line = raw.strip()
        if not line or len(line) > MAX_LINE_LENGTH:
            raise RequirementError(i, f"must be 1..{MAX_LINE_LENGTH} characters")
        out.append(_check(i, line))
    return sorted(set(out))


def requirement_kind(line: str) -> str:
    """What a normalised line installs from: 'artifact' (an upload), 'path', 'git' or 'index' (a PyPI-style pin)."""
    if line.startswith(ARTIFACT_PREFIX):
        return "artifact"
    if line.startswith("/"):
        return "path"
    if line.startswith("git+"):
        return "git"
    return "index"


def _check(i: int, line: str) -> str:
    if line.startswith(ARTIFACT_PREFIX):
        if not ARTIFACT_LINE.match(line.lower()):
            raise RequirementError(i, f"{line!r} is not artifact:<64 hex digits of the upload's sha256>")
        return line.lower()
    if line.startswith("-"):
        raise RequirementError(i, f"pip options are not accepted ({line.split()[0]!r})")
    if line.startswith("git+"):
        if not GIT_URL.match(line):
            raise RequirementError(i, f"{line!r} is not git+https://…@<7-40 hex commit sha>")
        return line
    if line.startswith("artifact:"):
        if not ARTIFACT.match(line):
            raise RequirementError(i, f"{line!r} is not artifact:<64 hex sha256>")
        return line
    if line.startswith("/"):
        parts = line.split("/")
        if any(c.isspace() for c in line) or ".." in parts or "\x00" in line:
            raise RequirementError(i, f"local path {line!r} must be absolute, without whitespace or '..'")
        return line
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        raise RequirementError(i, f"{line!r} is not a valid requirement ({exc})") from None
    if req.url:
        raise RequirementError(i, f"{line!r}: direct URLs other than git+https…@sha are not accepted")
    return str(req)


def _skipped(root: Path, path: Path) -> bool:
    # a pip build writes <name>.egg-info into the source tree: that must not make it a new build
    parts = path.relative_to(root).parts
    return bool(SKIP_PARTS.intersection(parts)) or any(p.endswith(".egg-info") for p in parts)


def _file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):  # streamed: never a whole file in memory
            h.update(chunk)
    return h.digest()


def local_source_digest(path: Path) -> str:
    """sha256 of a local wheel or source tree (caches and build output skipped); run inside the build job."""
    if path.is_file() and path.suffix != ".whl":
        raise ValueError(f"local file {path} is not a wheel (.whl)")
    if path.is_dir() and not any((path / f).is_file() for f in ("pyproject.toml", "setup.py")):
        raise ValueError(f"local directory {path} has no pyproject.toml or setup.py")
    if not path.exists():
        raise ValueError(f"local path {path} does not exist")
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not _skipped(path, p))
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        h.update(_file_digest(f))
    return h.hexdigest()


def content_hash(lines: list[str], *, torch_version: str, python_version: str) -> str:
    """sha256 of what a build installs: recipe, Python, torch, each line; with a local path, unique per call.

    Local trees are hashed by the build job, not here, so the API cannot tell whether one changed:
    a set with a local path gets a fresh build every time rather than a stale one.
    """
    h = hashlib.sha256(f"recipe={RECIPE_VERSION}\npython={python_version}\ntorch={torch_version}\n".encode())
    for line in normalize(lines):
        h.update(line.encode() + b"\n")
        if line.startswith("/"):
            h.update(secrets.token_bytes(16))
    return h.hexdigest()
