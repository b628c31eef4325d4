"""Stage bookkeeping for a phase: error documents, a hang watchdog, and cross-rank agreement.

A failing save/load must come back as a document, never as a hang: every stage runs under a
watchdog that writes the rank's document and exits if the stage overruns, and stages whose
failure can be one-sided agree on the outcome over all ranks before anyone enters a collective.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from jobs.contract import ErrorRecord, PhaseDocument, Stage, error_record, exception_record

T = TypeVar("T")
log = logging.getLogger("jobs.rank.entry")


class PhaseAbort(Exception):
    """Raised to stop a phase; carries the error records of every rank that failed."""

    def __init__(self, errors: list[ErrorRecord]) -> None:
        super().__init__(errors[0]["message"] if errors else "phase aborted")
        self.errors = errors


def write_json(path: Path, doc: Any) -> None:
    """Write a JSON document atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


# Seams for tests, never set by the service: a test's faults come from a test-only plugin that sets these in the
# job's own processes (tests/plugins/job_faults.py: a sitecustomize on the job's PYTHONPATH), so nothing here reads
# a fault-injection variable and no test variable reaches a real job (issue 54).
# stage_started(stage, rank): may raise, exit or kill the process at the start of a stage;
# step_done(folder, rank, step): may hold the rank between steps (a test strikes a fault mid-run then).
TestHook = Callable[..., None]
STAGE_STARTED: list[TestHook] = []
STEP_DONE: list[TestHook] = []


def _inject_fault(stage: str, rank: int) -> None:
    for hook in STAGE_STARTED:
        hook(stage, rank)


def hold_if_asked(folder: Path, rank: int, step: int) -> None:
    """Between steps (no stage timer runs): whatever a test's plugin asks (none in a real job)."""
    for hook in STEP_DONE:
        hook(folder, rank, step)


class RankContext:
    """Per-rank state of one phase: its document, its folder, and the current stage."""

    def __init__(self, folder: Path, rank: int, doc: PhaseDocument) -> None:
        self.folder = folder
        self.rank = rank
        self.doc = doc
        self.stage: Stage = "start"
        self.distributed = False
        # This rank's build-time probe reports, until a collective gathers them into the document.
        self.local_build_probes: dict[str, Any] | None = None
        # an async save's AsyncCallsQueue until it is finalized (jobs/rank/checkpoint.py)
        self.pending_save: Any = None
        self._timer: threading.Timer | None = None

    @property
    def result_path(self) -> Path:
        """Where this rank's result document is written."""
        return self.folder / f"result.rank{self.rank}.json"

    def _on_timeout(self, stage: Stage, seconds: float) -> None:
        msg = f"stage {stage!r} exceeded {seconds:.0f} s (hung collective or peer died)"
        log.error(msg)
        self.doc["status"] = "error"
        self.doc["error"] = error_record("StageTimeout", msg, stage=stage, rank=self.rank)
        try:
            write_json(self.result_path, self.doc)
        finally:
            logging.shutdown()
            os._exit(124)  # the only way out of a collective that never returns

    @contextmanager
    def stage_scope(self, name: Stage, timeout_s: float) -> Iterator[None]:
        """Mark the current stage and arm the watchdog for it."""
        self.stage = name
        timer = threading.Timer(timeout_s, self._on_timeout, args=(name, timeout_s))
        timer.daemon = True
        timer.start()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            timer.cancel()
            seconds = self.doc.setdefault("stage_seconds", {})
            seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - t0, 4)

    def run(self, name: Stage, fn: Callable[[], T], timeout_s: float, agree: bool = False) -> T:
        """Run one stage; on failure raise PhaseAbort (after all ranks agree, when `agree`)."""
        from jobs.rank import dist

        with self.stage_scope(name, timeout_s):
            err: ErrorRecord | None = None
            value: Any = None
            try:
                _inject_fault(name, self.rank)
                value = fn()
            except (KeyboardInterrupt, SystemExit, GeneratorExit):
                raise
            # every failure becomes part of the document; BaseException too, since torch.distributed.checkpoint
            # raises its CheckpointException (a build's load or save that failed on any rank) as one
            except BaseException as exc:  # noqa: BLE001
                err = exception_record(exc, name, self.rank)
                log.error("stage %s failed: %s", name, err["traceback"])
            if agree and self.distributed:
                try:
                    errors = [e for e in dist.gather(err) if e]
                except Exception:
                    if err is None:
                        raise
                    # this rank failed where its peers went on into a collective (e.g. a check only
                    # rank 0 runs): the agreement cannot line up and times out; the root cause is ours
                    log.error("stage %s: ranks could not agree after this rank's error", name)
                    errors = [err]
            else:
                errors = [err] if err else []
            if errors:
                raise PhaseAbort(errors)
            return value
