"""Job payloads that misbehave on purpose: what a hostile phase leaves running. A module of its own so a
test can pickle it by value (cloudpickle) for a job user that cannot import the checkout's tests."""

from __future__ import annotations

from pathlib import Path


def leave_a_daemon(pid_file: str) -> int:
    """A job that starts a `setsid` daemon (out of its process group and session) and returns at once."""
    import subprocess
    import sys

    daemon = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid() if os.getsid(0) != os.getpid() "
                               "else None; time.sleep(600)"], start_new_session=True)
    Path(pid_file).write_text(str(daemon.pid))
    return daemon.pid


def queue_a_later_slurm_job() -> dict[str, object]:
    """A job that queues a Slurm job of its own to run after its lease ends (the review's `sbatch --begin`)."""
    import os
    import subprocess

    done = subprocess.run(["sbatch", "--begin=now+300", "--parsable", "--wrap", "id"], capture_output=True, text=True)
    return {"user": os.getuid(), "rc": done.returncode, "out": done.stdout.strip(), "err": done.stderr.strip()}
