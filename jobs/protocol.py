"""One plan for a run: its phases, the tasks of each, the isolation, each attempt's payload, and how
the ranks' documents become the phase's document.

Both launchers execute this plan: run-local (`jobs/launch/local.py`) runs it in place, the scheduler
(`service/scheduler/submitter.py`, `service/scheduler/reconciler.py`) persists it one phase attempt at a time.
Neither decides any of it on its own, so a reproduction runs exactly what the service ran.

What a job writes is data, never code: a phase's outcome is read from the ranks' JSON documents in
the attempt folder (`jobs/run_folder.py`), each opened without following links and bounded in size;
nothing a job can write is ever unpickled, imported or executed by the reader.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from jobs.contract import PhaseDocument, PhaseName
from jobs.documents import merge_rank_documents
from jobs.run_folder import AttemptFolder, RunFolder
from jobs.spec import RunSpec

PHASES: tuple[PhaseName, PhaseName] = ("train_and_save", "resume")
# A rank document carries per-step records and probe fingerprints: a few MB at the largest shapes.
# Anything bigger is not a document this harness wrote, and is refused before it is read.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


class UnreadableDocument(ValueError):
    """A rank document that is a link, not a regular file, too large, or not a JSON object."""


def read_job_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of a file a job wrote: never through a symlink, never a device or FIFO, at most max_bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableDocument(f"{path.name}: is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not _is_regular(info.st_mode):
            raise UnreadableDocument(f"{path.name}: not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableDocument(f"{path.name}: {info.st_size} bytes, more than the {max_bytes} allowed")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnreadableDocument(f"{path.name}: grew past the {max_bytes} bytes allowed while read")
    return data


def read_job_file_tail(path: Path, max_bytes: int) -> str:
    """The last max_bytes of a log a job wrote (never through a symlink), as text; "" when absent or refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not _is_regular(info.st_mode):
            return ""
        fh.seek(max(0, info.st_size - max_bytes))
        return fh.read(max_bytes).decode("utf-8", "replace")


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def read_rank_document(path: Path) -> PhaseDocument:
    """One rank's result document, read as data (see read_job_file); a JSON object or UnreadableDocument."""
    try:
        value = json.loads(read_job_file(path, MAX_DOCUMENT_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise UnreadableDocument(f"{path.name}: not JSON ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise UnreadableDocument(f"{path.name}: not a JSON object")
    return cast(PhaseDocument, value)


@dataclass(frozen=True)
class Payload:
    """What one job of an attempt runs: an entry point of jobs/rank, its arguments, and its size."""

    entry: str  # "attempt" (fork every phase in fresh children) or "phase" (this process runs one phase)
    args: tuple[Any, ...]
    tasks: int
    nodes: int
    phases: tuple[PhaseName, ...]  # the phases this job runs, in order
    # GPUs the job asks for on each node: one per rank there for a `cuda` spec, none for `cpu`
    # (submitit's gpus_per_node locally and on Slurm, --gpus-per-node; service/executors/launcher.py)
    gpus_per_node: int = 0

    def function(self) -> Callable[..., Any]:
        """The entry point itself (imported here, lazily: jobs/rank imports torch only when it runs)."""
        if self.entry == "attempt":
            from jobs.rank.attempt import run_attempt

            return run_attempt
        from jobs.rank.entry import run_rank_phase

        return run_rank_phase


@dataclass(frozen=True)
class RunPlan:
    """The plan of one run, from its spec (a RunSpec, or the plain form the service stores)."""

    spec: RunSpec

    @classmethod
    def of(cls, spec: RunSpec | dict[str, Any]) -> RunPlan:
        """The plan of a spec (validated: a stored spec that no longer validates raises SpecError).

        A stored spec without `isolation` predates the field, when every phase was its own job: it
        keeps running that way rather than switching mode halfway through its attempts.
        """
        if isinstance(spec, RunSpec):
            return cls(spec)
        return cls(RunSpec.from_dict(spec if "isolation" in spec else {**spec, "isolation": "job"}))

    @property
    def isolation(self) -> str:
        """How the phases are launched: "process" (one job forks both) or "job" (a job per phase)."""
        return self.spec.effective_isolation

    @property
    def nodes(self) -> int:
        """The Slurm nodes every job of the run spreads its ranks over."""
        return self.spec.nodes

    def tasks(self, phase: str) -> int:
        """The ranks a phase runs with: its DP size (resume_dp for a resharded resume) x tp x pp."""
        return self.spec.phase_world_size(phase)

    def forks_resume(self, phase: str) -> bool:
        """Whether the job of this phase also runs the resume (as resume attempt 1) in fresh children."""
        return self.isolation == "process" and phase == PHASES[0]

    def payload(self, run_folder: Path, phase: PhaseName, attempt: int = 1, checkpoint_attempt: int = 1) -> Payload:
        """The job that runs attempt `attempt` of `phase`; a resume loads train_and_save's `checkpoint_attempt`."""
        spec, root = self.spec.to_dict(), str(run_folder)
        if self.isolation == "process":
            # train_and_save attempt k forks its resume as resume attempt 1; a resume retry runs alone
            phases: tuple[PhaseName, ...] = PHASES if phase == PHASES[0] else (phase,)
            attempts = {PHASES[0]: attempt, PHASES[1]: 1} if phase == PHASES[0] else {phase: attempt}
            args: tuple[Any, ...] = (spec, root, phases, None, attempts, checkpoint_attempt)
            return Payload("attempt", args, self.tasks(phase), self.nodes, phases, self.gpus_per_node(phase))
        args = (spec, root, phase, None, attempt, checkpoint_attempt)
        return Payload("phase", args, self.tasks(phase), self.nodes, (phase,), self.gpus_per_node(phase))

    def gpus_per_node(self, phase: str) -> int:
        """GPUs each node of a phase's job needs: one per rank on that node for a cuda spec, else 0."""
        return self.spec.gpus_per_task * (self.tasks(phase) // self.nodes)

    def attempt_folder(self, run_folder: Path, phase: str, attempt: int) -> Path:
        """The folder of one attempt of one phase (jobs/run_folder.py)."""
        return RunFolder(run_folder).attempt(phase, attempt).folder

    def result_paths(self, attempt_folder: Path, phase: str) -> list[Path]:
        """Where each rank of an attempt leaves its document (what a finished phase is noticed by)."""
        where = AttemptFolder(attempt_folder)
        return [where.result(rank) for rank in range(self.tasks(phase))]

    def finished(self, attempt_folder: Path, phase: str) -> bool:
        """Whether every rank of the attempt has written its document."""
        return all(p.exists() for p in self.result_paths(attempt_folder, phase))

    def collect(self, attempt_folder: Path, phase: str) -> tuple[PhaseDocument | None, list[str]]:
        """(the phase's document merged from the ranks that wrote one, or None; why any rank's was refused).

        A rank that died leaves no document: the others speak for the phase (rank 0's, carrying the
        root-cause error of whichever rank failed first, `jobs/documents.merge_rank_documents`).
        """
        docs, refused = self.rank_documents(attempt_folder, phase)
        return merge_rank_documents(docs), refused

    def rank_documents(self, attempt_folder: Path, phase: str) -> tuple[list[PhaseDocument], list[str]]:
        """(the documents the ranks of an attempt wrote, in rank order; why any rank's was refused)."""
        docs: list[PhaseDocument] = []
        refused: list[str] = []
        for rank, path in enumerate(self.result_paths(attempt_folder, phase)):
            try:
                docs.append(read_rank_document(path))
            except FileNotFoundError:
                continue
            except (UnreadableDocument, OSError) as exc:
                refused.append(f"rank {rank}: {exc}")
        return docs, refused
