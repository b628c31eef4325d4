"""The requirement line that names an uploaded artifact: `artifact:<sha256>` (its own kind, for permission rules).

A module of its own, stdlib only: the build job imports it (recipe -> requirements -> here) in the job's own
process, and store.py's SQLAlchemy and models cost that job 0.5 s, which a gate pays on every build
(tests/service/test_build_job_imports.py).
"""

from __future__ import annotations

import re

ARTIFACT_PREFIX = "artifact:"
ARTIFACT_LINE = re.compile(r"^artifact:([0-9a-f]{64})$")


def artifact_sha(line: str) -> str | None:
    """The SHA-256 an `artifact:<sha256>` line names, else None."""
    match = ARTIFACT_LINE.match(line.strip())
    return match.group(1) if match else None
