"""The run folder, written down once: where each attempt of each phase keeps its files.

```
<run folder>/
  <phase>/attempt-<k>/         one attempt of one phase (a retry never reuses a folder)
    submitit/                  submitit's pickles and per-task stdout/stderr
    rank<r>.log                the rank's own log (where a caught traceback lands)
    result.rank<r>.json        the rank's result document
    checkpoint/step<N>/        the checkpoint this attempt saved (train_and_save)
```

The resume phase loads the checkpoint of the train_and_save attempt that succeeded, named by
`checkpoint_attempt`. Shared by the submitter, the reconciler, the ranks and the log viewer.
Plain paths only: no torch, nothing from service/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The files the log viewer may serve: rank logs and submitit's stdout/stderr.
LOG_SUFFIXES = (".log", ".out", ".err")


@dataclass(frozen=True)
class AttemptFolder:
    """The folder of one attempt of one phase and the files in it."""

    folder: Path

    @property
    def submitit(self) -> Path:
        """submitit's folder for this attempt's job."""
        return self.folder / "submitit"

    def rank_log(self, rank: int) -> Path:
        """The rank's own log file."""
        return self.folder / f"rank{rank}.log"

    def result(self, rank: int) -> Path:
        """The rank's result document (JSON)."""
        return self.folder / f"result.rank{rank}.json"

    def checkpoint(self, step: int) -> Path:
        """The checkpoint of `step` saved by this attempt."""
        return self.folder / "checkpoint" / f"step{step}"

    def logs(self) -> list[Path]:
        """Every log file of this attempt that exists: rank logs first, then submitit's stdout/stderr."""
        own = sorted(self.folder.glob("rank*.log"))
        job = sorted(p for p in self.submitit.glob("*") if p.suffix in LOG_SUFFIXES) if self.submitit.is_dir() else []
        return own + job


@dataclass(frozen=True)
class RunFolder:
    """The folder of one run; every attempt of every phase is a subfolder."""

    root: Path

    def attempt(self, phase: str, attempt: int) -> AttemptFolder:
        """The folder of attempt `attempt` (1-based) of `phase`."""
        if attempt < 1:
            raise ValueError(f"attempt: must be 1 or more, got {attempt}")
        return AttemptFolder(Path(self.root) / phase / f"attempt-{attempt}")
