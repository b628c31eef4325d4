"""`python -m tests.plugins.crashing_scheduler`: `parity scheduler`, dying right after sbatch answers.

The fault a test needs (the scheduler killed between sbatch and submitit's bookkeeping, so a real Slurm job
exists that no row records) is made here, in a test-only entry point that wraps the service's Slurm executor,
and never in the service: nothing in service/ reads a fault-injection variable (issue 54).
"""

from __future__ import annotations

import logging
import os
import sys

from service.executors import launcher

EXIT_AFTER_SBATCH = 70  # what the test waits for


class _DyingSlurmExecutor(launcher._SlurmExecutor):
    def _submit_command(self, command: str):  # type: ignore[no-untyped-def]
        job = super()._submit_command(command)
        logging.getLogger(__name__).error("test fault: exiting after sbatch gave job %s", job.job_id)
        os._exit(EXIT_AFTER_SBATCH)


def main() -> int:
    launcher._SlurmExecutor = _DyingSlurmExecutor  # type: ignore[misc]
    from service.cli.main import main as parity

    return int(parity(["scheduler", *sys.argv[1:]]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
