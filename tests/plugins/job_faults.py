"""Faults for a test's jobs, from a test-only plugin: a `sitecustomize` the test puts on the jobs' PYTHONPATH.

The service reads no fault-injection variable and passes none to a job (issue 54). A test that needs a rank to
fail a stage, or to hold mid-run until it has struck, writes a plugin folder (`plugin_folder`): a
`sitecustomize.py` that Python runs at the start of every process whose path holds the folder, and the fault
it must install (`job_faults.json`, beside it). The plugin registers its hooks on jobs/rank/context.py's seams
(`STAGE_STARTED`, `STEP_DONE`) in the job's own processes; the test hands the folder down by PYTHONPATH (its
own environment for in-process runs, the scheduler's for a service), which the launcher passes to every job.

- `fault="stage:rank[:raise|exit|kill]"`: that rank fails that stage (raise: an exception the phase turns into
  its document; exit: a SystemExit that escapes it; kill: SIGKILL, nothing reports anything);
- `hold="step:release-file"`: after that step, while the release file does not exist, each rank writes
  `held.rank<r>` (its pid) in its attempt folder and waits: a test strikes then, knowing the attempt is mid-run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SITECUSTOMIZE = '''"""A test's job faults (tests/plugins/job_faults.py wrote this; never part of a real job)."""
import json
import os
import signal
import time
from pathlib import Path

_SPEC = json.loads((Path(__file__).parent / "job_faults.json").read_text())


def _stage_started(stage, rank):
    target, _, how = (_SPEC.get("fault") or "").partition(":")
    if target != stage or how.split(":")[0] != str(rank):
        return
    how = how.partition(":")[2] or "raise"
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit":
        raise SystemExit(f"injected crash in stage {stage} on rank {rank}")
    raise RuntimeError(f"injected fault in stage {stage} on rank {rank}")


def _step_done(folder, rank, step):
    target, _, release = (_SPEC.get("hold") or "").partition(":")
    if not release or target != str(step) or os.path.exists(release):
        return
    (Path(folder) / f"held.rank{rank}").write_text(str(os.getpid()))
    while not os.path.exists(release):
        time.sleep(0.05)


try:  # a process that cannot import the engine (a shell, a tool) runs no rank: nothing to install
    from jobs.rank import context as _context
except ImportError:
    _context = None
if _context is not None:
    _context.STAGE_STARTED.append(_stage_started)
    _context.STEP_DONE.append(_step_done)
'''


def plugin_folder(dest: Path, *, fault: str | None = None, hold: str | None = None) -> Path:
    """Write the plugin into dest (made passable and readable for a job user) and return it."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (dest / "job_faults.json").write_text(json.dumps({"fault": fault, "hold": hold}))
    for path in (dest, dest / "sitecustomize.py", dest / "job_faults.json"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return dest


def with_plugin(env: dict[str, str], folder: Path) -> dict[str, str]:
    """env with the plugin folder first on PYTHONPATH."""
    rest = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), rest]))}
