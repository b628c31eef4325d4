"""The triage page: signatures in plain words, what changed since the last good run, repro, logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.verdict.signatures import SIGNATURES
from models import Run
from service.runs.phase_documents import read_summary
from service.web.dashboard.logs import Excerpt, excerpts
from service.web.dashboard.reproduce import local_command, submit_command
from service.web.dashboard.runpage import load_run

# Phase-document info keys that describe the software a phase actually ran with.
VERSION_KEYS = ("megatron_core", "torch", "python", "platform", "device", "backend", "world_size", "cpu_shims")


@dataclass
class Change:
    """One key compared between the last good run and this run."""

    key: str
    good: Any
    this: Any

    @property
    def changed(self) -> bool:
        """Whether the two values differ."""
        return self.good != self.this


def diff(good: dict[str, Any], this: dict[str, Any]) -> list[Change]:
    """Key-by-key comparison of two flat mappings, changed keys first."""
    rows = [Change(k, good.get(k), this.get(k)) for k in sorted(set(good) | set(this))]
    return sorted(rows, key=lambda c: not c.changed)


def packages(run: Run) -> dict[str, Any]:
    """Software a run ran with: what its phases recorded, else the environment's package record.

    The environment row is shared by both runs of a comparison and only holds its latest record,
    so the versions the phases themselves reported are what tells two runs apart.
    """
    summary = read_summary(run.summary)
    phases = summary.get("phases") or {}
    # the evaluator's per-run record first, then the phases' own reports
    out: dict[str, Any] = {k.replace("_", "-"): v for k, v in (summary.get("packages") or {}).items()}
    for name in ("resume", "train_and_save"):  # train_and_save wins: it always ran
        phase = phases.get(name)
        info = phase["info"] if phase else {}
        out.update({k.replace("_", "-"): info[k] for k in VERSION_KEYS if k in info})
    return out or dict(run.environment.packages or {})


def explained(run: Run) -> list[dict[str, Any]]:
    """The run's signatures and advisories with their meaning, references and evidence."""
    summary = read_summary(run.summary)
    evidence = summary.get("evidence") or {}
    out = []
    for name in [*run.signatures, *(summary.get("advisories") or [])]:
        sig = SIGNATURES.get(name)  # type: ignore[call-overload]  # stored names may predate the table
        out.append({
            "name": name,
            "title": sig.title if sig else name,
            "meaning": sig.meaning if sig else "Not in this service's signature table.",
            "kind": sig.kind if sig else "unknown",
            "references": list(sig.references) if sig else [],
            "evidence": evidence.get(name),
        })
    return out


def failure_logs(run: Run, run_folder: Path) -> list[tuple[str, int, Excerpt]]:
    """Excerpts from the phases that failed, else from the last phase that ran. -> (phase, id, excerpt)."""
    failed = [p for p in run.phases if p.state in ("failed", "infra_failed")]
    chosen = failed or run.phases[-1:]
    return [(p.name, p.id, e) for p in chosen for e in excerpts(p, run_folder)]


def triage(session: Any, run_id: int, *, run_folder: Path, base_url: str) -> dict[str, Any]:
    """Everything the triage page shows."""
    run = load_run(session, run_id, with_phases=True)
    good = load_run(session, run.last_good_run_id) if run.last_good_run_id else None
    return {
        "run": run,
        "failed": run.verdict in ("fail", "error", "known-failure") or run.state in ("failed", "error"),
        "signatures": explained(run),
        "errors": read_summary(run.summary).get("errors") or [],
        "good": good,
        "spec_diff": diff(good.spec, run.spec) if good else [],
        "label_diff": diff(good.labels or {}, run.labels or {}) if good else [],
        "package_diff": diff(packages(good), packages(run)) if good else [],
        "local_command": local_command(run.spec),
        "submit_command": submit_command(run.spec, environment=run.environment.name, labels=run.labels or {},
                                         base_url=base_url),
        "python": run.environment.python,
        "logs": failure_logs(run, run_folder),
    }
