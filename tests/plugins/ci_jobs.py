"""Run the shell lines of the shipped CI jobs (docs/ci/*.yml) as the CI runner would, on this machine.

GitHub Actions: every `run:` step of the job in order (`uses:` steps are the runner's business), each
under `bash --noprofile --norc -eo pipefail` with the step's `env:`, `${{ … }}` expressions filled in from
a context dict (`a || b || 'literal'` as Actions evaluates it). GitLab CI: each `script:` line under
`bash -e`. A step named in `skip` (the client's install: the test installs it itself) is left out.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class StepResult:
    """One executed step: its name, exit code and output."""

    name: str
    returncode: int
    output: str


def evaluate(expr: str, context: dict[str, str]) -> str:
    """An Actions expression of context names, 'literals' and `||`: the first non-empty value."""
    for term in (t.strip() for t in expr.split("||")):
        value = term[1:-1] if term.startswith("'") and term.endswith("'") else context.get(term, "")
        if value:
            return value
    return ""


def fill(text: str, context: dict[str, str]) -> str:
    """Replace every ${{ … }} in text."""
    return EXPRESSION.sub(lambda m: evaluate(m.group(1), context), text)


def _run(name: str, script: str, shell: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> StepResult:
    proc = subprocess.run([*shell, script], cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    out = proc.stdout + proc.stderr
    with log.open("a") as fh:
        fh.write(f"\n===== {name} (exit {proc.returncode})\n$ {script}\n{out}")
    return StepResult(name, proc.returncode, out)


def github_job(context: dict[str, str], *, cwd: Path, env: dict[str, str], log: Path,
               skip: tuple[str, ...] = ("Install the parity client",)) -> list[StepResult]:
    """Run docs/ci/github-actions.yml's `parity` job; stops at the first failing step, as Actions does."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docs/ci/github-actions.yml").read_text())
    results = []
    for step in doc["jobs"]["parity"]["steps"]:
        if "run" not in step or step.get("name") in skip:
            continue
        step_env = {**env, **{k: fill(str(v), context) for k, v in (step.get("env") or {}).items()}}
        result = _run(step["name"], fill(step["run"], context), ["bash", "--noprofile", "--norc", "-eo", "pipefail",
                                                                  "-c"], cwd=cwd, env=step_env, log=log)
        results.append(result)
        if result.returncode != 0:
            break
    return results


def gitlab_job(*, cwd: Path, env: dict[str, str], log: Path, skip_prefix: str = "pip install") -> list[StepResult]:
    """Run docs/ci/gitlab-ci.yml's `resume-parity` script lines; stops at the first failing line."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docs/ci/gitlab-ci.yml").read_text())
    results = []
    for i, line in enumerate(doc["resume-parity"]["script"]):
        if line.strip().startswith(skip_prefix):
            continue
        result = _run(f"script[{i}]", line, ["bash", "-e", "-c"], cwd=cwd, env=env, log=log)
        results.append(result)
        if result.returncode != 0:
            break
    return results
