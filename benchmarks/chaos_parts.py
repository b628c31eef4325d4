"""Pieces of the chaos benchmark: a private Postgres, a failing-sbatch switch, fault-injecting
environments, and the processes it starts. Nothing here touches the shared Postgres on 5432 or the
shared Slurm's configuration."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARITY = [sys.executable, "-m", "service.cli.main"]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """A throwaway Postgres cluster (initdb + pg_ctl) on its own port, restartable at will."""

    def __init__(self, root: Path) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            raise SystemExit("chaos: needs Postgres server binaries (/usr/lib/postgresql/*/bin)")
        self.bin = Path(found[-1]).parent
        self.root = root / "pg"
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/parity"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if os.geteuid() == 0:  # Postgres refuses to run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        """initdb (trust auth, local only), start, create the database."""
        self.root.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "parity")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        """Fast shutdown: every connection is cut, as in a failover or a restart."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


class SbatchSwitch:
    """An `sbatch` first on the scheduler's PATH that refuses jobs while switched on, else runs the real one."""

    def __init__(self, root: Path) -> None:
        real = shutil.which("sbatch")
        if real is None:
            raise SystemExit("chaos: sbatch not on PATH (source /var/tmp/parity-slurm/env.sh)")
        self.dir = root / "shim"
        self.dir.mkdir()
        self.flag = root / "sbatch-down"
        shim = self.dir / "sbatch"
        shim.write_text(
            "#!/bin/sh\n"
            f'if [ -e "{self.flag}" ]; then\n'
            '  echo "sbatch: error: Batch job submission failed: Required partition not available (chaos)" >&2\n'
            "  exit 1\nfi\n"
            f'exec "{real}" "$@"\n'
        )
        shim.chmod(0o755)

    def down(self) -> None:
        """sbatch fails from now on."""
        self.flag.touch()

    def up(self) -> None:
        """sbatch works again."""
        self.flag.unlink(missing_ok=True)


# Imported by the job's Python (sitecustomize on PYTHONPATH): patches the rank's step at run time.
HOOK = '''
import importlib.abc, importlib.util, os, signal, sys

MODE = os.environ.get("PARITY_CHAOS")
FIRST_STEP = {}  # per process (phases may be forked children of one job): resume starts after step 1


def _patch(module):
    step_fn = module._one_step

    def _one_step(tr, step, world):
        rank = int(os.environ.get("RANK", "0"))
        PHASE = "train_and_save" if FIRST_STEP.setdefault(os.getpid(), step) == 1 else "resume"
        if MODE == "kill" and PHASE == "train_and_save" and rank == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # one rank dies mid-phase
        record = step_fn(tr, step, world)
        if MODE == "nan" and PHASE == "resume" and rank == 0:
            record["loss"] = float("nan")  # a rank reports a NaN loss
        return record

    module._one_step = _one_step


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "jobs.rank.training":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if MODE:
    sys.meta_path.insert(0, _Hook())
'''


def fault_python(root: Path, mode: str) -> Path:
    """An executable that runs this Python with the chaos hook (mode: nan | kill) on its path."""
    hooks = root / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(HOOK)
    wrapper = root / f"python-{mode}"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{hooks}${{PYTHONPATH:+:$PYTHONPATH}}" PARITY_CHAOS={mode} exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


class Proc:
    """A `parity` subcommand in its own process group, with its log."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name, self.args, self.env, self.logdir = name, args, env, logdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (or restart) it."""
        log = open(self.logdir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen([*PARITY, *self.args], env=self.env, cwd=REPO, stdout=log, stderr=log,
                                     start_new_session=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal it (SIGKILL: no cleanup at all) and reap it."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=60)

    def alive(self) -> bool:
        """Whether it is still running."""
        return self.proc is not None and self.proc.poll() is None


def wait_until(check, timeout: float, what: str, every: float = 0.5) -> float:
    """Poll check() until true; return the seconds it took (raise after timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if check():
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - anything going wrong means "not yet"
            pass
        time.sleep(every)
    raise TimeoutError(f"chaos: {what} not within {timeout:.0f}s")
