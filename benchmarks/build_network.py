"""What a local build's own network costs: the same download from the package index in a real local job, through
its index gateway (the default, service/executors/index_gateway.py) and with the network isolation waived (the
node's network, as before); prints seconds and MB/s per repetition, alternating so load falls on both alike.

    .venv/bin/python benchmarks/build_network.py [--package numpy==2.2.6] [--repeat 3]

Run as root (the sandbox needs it). pip downloads with no cache, no extra index and no local wheel folder, so every
byte comes from the index (pypi.org and files.pythonhosted.org) through whichever way out the job has.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service.core.settings import Settings  # noqa: E402
from service.environments.build_steps import pip_environment  # noqa: E402
from service.executors import launcher  # noqa: E402


def download(package: str, dest: str) -> tuple[float, int]:
    """The job: pip download `package` (no dependencies) into dest; (seconds, bytes)."""
    import os

    env = {**os.environ, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "", "PIP_NO_CACHE_DIR": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                           "-q", "-d", dest, package], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip download failed: {done.stderr[-2000:]}")
    return time.perf_counter() - t0, sum(p.stat().st_size for p in Path(dest).iterdir())


def one(base: Path, package: str, waived: bool, n: int) -> tuple[float, int]:
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    folder = base / "runs" / "environments" / f"b{n}" / "job"
    folder.mkdir(parents=True)
    dest = folder.parent / "wheels"
    dest.mkdir()
    settings = Settings(executor="local", run_folder=base / "runs", job_isolation_waive="network" if waived else None)
    job = launcher.submit_phase(launcher.JobRequest(
        executor="local", folder=folder, python=sys.executable, tasks=1, name="build-network", function=download,
        args=(package, str(dest)), network=True, env_names=pip_environment(),
    ), settings)  # pip's own settings, as a build gets them
    try:
        result: tuple[float, int] = launcher._LOCAL_JOBS[job.job_id].result()
        return result
    finally:
        launcher.end_job(job, settings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="numpy==2.2.6")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="parity-build-network-", dir="/var/tmp"))
    base.chmod(0o711)
    times: dict[str, list[float]] = {"gateway": [], "node network": []}
    try:
        n = 0
        for _ in range(args.repeat):
            for way in times:
                n += 1
                seconds, size = one(base, args.package, way == "node network", n)
                times[way].append(seconds)
                print(f"{way:13} {seconds:6.2f} s  {size / 1e6:6.1f} MB  {size / 1e6 / seconds:6.1f} MB/s", flush=True)
        for way, values in times.items():
            print(f"{way:13} median {statistics.median(values):.2f} s over {len(values)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
