"""Commit statuses on GitHub or GitLab for `parity submit --github-status | --gitlab-status`.

The forge, repository, commit and token come from the CI job's own environment: GitHub Actions'
GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_SHA and GITHUB_TOKEN; GitLab CI's CI_API_V4_URL,
CI_PROJECT_ID, CI_COMMIT_SHA and GITLAB_TOKEN (a token with the api scope: a job token cannot set
statuses). A status that cannot be posted is a warning, never the job's verdict.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import httpx

# the service's outcome -> each forge's state names (GitLab has no "error")
GITHUB_STATES = {"pending": "pending", "pass": "success", "fail": "failure", "error": "error"}
GITLAB_STATES = {"pending": "running", "pass": "success", "fail": "failed", "error": "failed"}


@dataclass
class Forge:
    """Where to post statuses for one commit."""

    kind: str  # github | gitlab
    api: str
    project: str
    sha: str
    token: str
    context: str

    def post(self, outcome: str, *, url: str, description: str) -> bool:
        """Post the status for outcome (pending | pass | fail | error); False (and a warning) on failure."""
        description = description[:140]  # GitHub's limit
        try:
            if self.kind == "github":
                resp = httpx.post(
                    f"{self.api}/repos/{self.project}/statuses/{self.sha}",
                    json={"state": GITHUB_STATES[outcome], "target_url": url, "description": description,
                          "context": self.context},
                    headers={"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json"},
                    timeout=30)
            else:
                resp = httpx.post(
                    f"{self.api}/projects/{self.project}/statuses/{self.sha}",
                    data={"state": GITLAB_STATES[outcome], "target_url": url, "description": description,
                          "name": self.context},
                    headers={"PRIVATE-TOKEN": self.token}, timeout=30)
        except httpx.HTTPError as exc:
            print(f"parity: warning: posting the {self.kind} status failed: {exc}", file=sys.stderr)
            return False
        if resp.status_code >= 300:
            print(f"parity: warning: the {self.kind} status was refused: {resp.status_code} {resp.text[:300]}",
                  file=sys.stderr)
            return False
        return True


def _need(names: tuple[str, ...], flag: str) -> list[str]:
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        raise SystemExit(f"parity submit: {flag} needs {', '.join(missing)} in the environment")
    return [os.environ[n] for n in names]


def from_environment(kind: str | None, *, context: str, sha: str | None = None) -> Forge | None:
    """The forge named by --github-status / --gitlab-status (None for neither); SystemExit(2) if unset."""
    if kind == "github":
        repo, token = _need(("GITHUB_REPOSITORY", "GITHUB_TOKEN"), "--github-status")
        sha = sha or _need(("GITHUB_SHA",), "--github-status")[0]
        api = os.environ.get("GITHUB_API_URL", "https://api.github.com").rstrip("/")
        return Forge("github", api, repo, sha, token, context)
    if kind == "gitlab":
        api, project, token = _need(("CI_API_V4_URL", "CI_PROJECT_ID", "GITLAB_TOKEN"), "--gitlab-status")
        sha = sha or _need(("CI_COMMIT_SHA",), "--gitlab-status")[0]
        return Forge("gitlab", api.rstrip("/"), project, sha, token, context)
    return None
