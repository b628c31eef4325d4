"""A small local git repository for source and track tests: commits with fixed dates and subjects."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

PYPROJECT = '[project]\nname = "megatron-core"\nversion = "0.0.1"\n'


class Repo:
    """A git repository at path; each `commit` writes files and commits them with a subject, one day apart."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.day = 0
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        """Run git in the repository; its stdout."""
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
               "GIT_AUTHOR_DATE": f"2026-08-{10 + self.day:02d}T12:00:00+00:00",
               "GIT_COMMITTER_DATE": f"2026-08-{10 + self.day:02d}T12:00:00+00:00"}
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()

    def commit(self, subject: str, files: dict[str, str] | None = None) -> str:
        """Write files (None: a changelog line; {}: commit what the tree holds), commit; the new sha."""
        for rel, text in (files if files is not None else {"CHANGES": f"{subject}\n"}).items():
            path = self.path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        self.git("add", "-A")
        self.day += 1
        self.git("commit", "-q", "--allow-empty", "-m", subject)
        return self.git("rev-parse", "HEAD")
