"""The triage page's repro and "what changed" read right where they are pasted: the first command runs with only
the base client through the service, the build's identity leads the comparison, and copy-as-issue has no host
paths."""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session

from models import Environment, Run
from service.core.tokens import create_token
from service.web.dashboard import logs
from tests.plugins.seed import golden_run
from tests.plugins.server import configure, serve

SHA = "ab" * 32
VENV = "/var/lib/parity/environments/ab12cd/venv/bin/python"
# the base install: no torch, Megatron-Core, submitit, SQLAlchemy, FastAPI or pydantic (pyproject.toml)
BASE_CLIENT = """
import importlib.abc, sys
SERVICE_ONLY = {"torch", "megatron", "numpy", "submitit", "sqlalchemy", "fastapi", "pydantic", "pydantic_settings",
                "psycopg", "psycopg_pool", "jinja2", "uvicorn", "alembic", "psutil", "prometheus_client"}
class BaseClientOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in SERVICE_ONLY:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the base client)", name=name)
        return None
sys.meta_path.insert(0, BaseClientOnly())
from service.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _env(session: Session, name: str, mcore: str) -> Environment:
    env = Environment(name=name, python=VENV.replace("ab12cd", name), packages={}, state="ready",
                      requirements=[f"artifact:{SHA}"] if name == "pr-build" else [f"megatron-core=={mcore}"],
                      megatron_core=mcore, freeze=[f"megatron_core @ file:///var/lib/parity/artifacts/{SHA}/"
                                                   f"megatron_core-{mcore}-py3-none-any.whl", "torch==2.13.0"])
    session.add(env)
    session.flush()
    return env


def _triaged(session: Session) -> Run:
    good = golden_run(session, _env(session, "main-build", "0.16.0"), "good")
    bad = golden_run(session, _env(session, "pr-build", "0.16.1"), "bad")
    bad.last_good_run_id = good.id
    bad.labels = {"branch": "pr-7", "commit": "abc1234", "suite": "gate", "suite_run": "0123456789ab",
                  "suite_check": "dp2-moe"}
    session.flush()
    return bad


def test_what_changed_leads_with_the_builds_identity_and_the_issue_has_no_host_paths(client, db_session) -> None:
    run = _triaged(db_session)
    page = html.unescape(client.get(f"/runs/{run.id}/triage").text)
    env_table = page[page.index('id="env-diff"'):page.index("</table>", page.index('id="env-diff"'))]
    keys = re.findall(r"<tr class=\"\w+\"><td><code>([^<]+)</code>", env_table)
    assert keys[:3] == ["megatron-core", "artifact sha256", "commit"], keys
    assert SHA in env_table and "abc1234" in env_table and "venv" not in env_table
    issue = page[page.index('<textarea id="issue-md"'):page.index("</textarea>")]
    assert "/var/lib" not in issue and "file://" not in issue and "venv" not in issue, issue
    assert "parity submit" in issue and "--label repro_of=" in issue
    assert all(len(line) < 400 or line.startswith("parity ") for line in issue.splitlines())
    start = page.index('<section id="reproduce">')
    repro = page[start:page.index("</section>", start)]
    assert repro.index('id="cmd-submit"') < repro.index('id="cmd-local"')  # the base client's command first
    assert "[engine]" in repro and "suite_run=" not in repro


def test_the_first_repro_command_runs_with_only_the_base_client(committed_db: str, monkeypatch,
                                                                 tmp_path: Path) -> None:
    configure(monkeypatch)
    engine = create_engine(committed_db)
    with Session(engine) as session:
        run = _triaged(session)
        run_id, check_key = run.id, run.check_key
        session.execute(update(Environment).where(Environment.name == "pr-build").values(python=sys.executable))
        token = create_token(session, name="ci", scopes=["submit"], tracks=["*"])
        session.commit()
    with serve() as url:
        import httpx

        page = html.unescape(httpx.get(f"{url}/runs/{run_id}/triage", timeout=60).text)
        command = re.search(r'<pre class="cmd" id="cmd-submit">([^<]+)</pre>', page)
        assert command, "no submit command on the triage page"
        words = shlex.split(command.group(1))
        assert words[:2] == ["parity", "submit"] and "--url" in words and words[-1] == "--wait"
        words[words.index("--url") + 1] = url  # the page's public URL is the test client's; the server is here
        done = subprocess.run([sys.executable, "-c", BASE_CLIENT, *words[1:], "--timeout", "2"],
                              env={**os.environ, "PARITY_TOKEN": token}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "timed out" in done.stderr, done.stdout + done.stderr  # queued; no scheduler here
    serve_cmd = subprocess.run([sys.executable, "-c", BASE_CLIENT, "serve"], capture_output=True, text=True,
                               timeout=60)
    assert serve_cmd.returncode == 2 and "[service]" in serve_cmd.stderr  # the stand-in is a base client indeed
    with Session(engine) as session:
        repro = session.scalars(select(Run).where(Run.id != run_id).order_by(Run.id.desc())).first()
        assert repro is not None and repro.check_key == check_key  # the same check, queued through the service
        assert repro.labels == {"branch": "pr-7", "commit": "abc1234", "repro_of": str(run_id)}
    engine.dispose()


def test_log_excerpts_drop_a_warning_and_the_source_line_under_it() -> None:
    lines = ["step 9", "/x/torch/optim.py:12: UserWarning: deprecated", "  return torch.foo(x)", "step 10",
             "Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'step'"]
    kind, window = logs.failure_window(lines)
    assert [w.text for w in window] == ["step 9", "step 10", *lines[4:]]
