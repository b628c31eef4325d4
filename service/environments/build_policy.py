"""Who may build what: a build installs (and so runs) whatever its requirement lines name.

- admin: anything, local paths included (a local path is hashed inside the build job, never here);
- build scope: any requirement line except local paths;
- submit scope: only sources an admin allow-listed in PARITY_BUILD_ALLOW (comma-separated):
  a project name (`megatron-core`: its released versions, pinned exactly with ==),
  a repository (`git+https://github.com/NVIDIA/Megatron-LM`: that repository at a full 40-hex commit),
  `artifact` (uploaded artifacts named by their sha256: `artifact:<sha256>`).
"""

from __future__ import annotations

import re

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from service.core.errors import Forbidden
from service.core.settings import Settings

FULL_SHA_GIT = re.compile(r"^(git\+https://[A-Za-z0-9._~:/%\-]+?)(?:\.git)?@([0-9a-f]{40})(#egg=[A-Za-z0-9_.\-]+)?$")
ARTIFACT = re.compile(r"^artifact:[0-9a-f]{64}$")
EXACT_VERSION = re.compile(r"^==[0-9][0-9A-Za-z.+!\-]*$")


def _allowed(line: str, allow: frozenset[str]) -> bool:
    if ARTIFACT.match(line):
        return "artifact" in allow
    git = FULL_SHA_GIT.match(line)
    if git:
        return git.group(1).rstrip("/") in allow
    if line.startswith(("git+", "/")):
        return False
    try:
        req = Requirement(line)
    except InvalidRequirement:
        return False
    # a released version, pinned: `megatron-core>=0` would let the index pick anything, pre-releases included
    return (canonicalize_name(req.name) in allow and req.url is None and req.marker is None
            and EXACT_VERSION.match(str(req.specifier)) is not None)


def authorize_build(lines: list[str], scopes: list[str], settings: Settings) -> None:
    """403 naming the first requirement line this token may not build."""
    if "admin" in scopes:
        return
    allow = settings.build_allow_set()
    for i, line in enumerate(lines):
        field = f"requirements[{i}]"
        if line.startswith("/"):
            raise Forbidden(f"{field}: local paths are for admin tokens only", field=field)
        if "build" in scopes:
            continue
        if not _allowed(line, allow):
            raise Forbidden(
                f"{field}: {line!r} is not an allowed source for a submit token (PARITY_BUILD_ALLOW: "
                f"{', '.join(sorted(allow)) or 'nothing'}; released versions pinned with ==, git URLs at a full "
                "40-hex commit, artifact:<sha256>); a token with the build scope may install any line",
                field=field)
