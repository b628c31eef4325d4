"""The triage page: findings in sentences, what changed since the last good run (environment, Python,
Megatron-Core, pip freeze, spec, labels), a repro that reproduces, logs from the failing phase."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from jobs.signature_names import LR_SCHEDULE_MISMATCH
from jobs.verdict.signatures import SIGNATURES
from jobs.verdict_names import NOT_PASSED, PASS
from models import Environment, ProbeFinding, Run
from service.runs.phase_documents import read_summary
from service.web.dashboard.findings import explain_crash, fingerprint_hows, sentence
from service.web.dashboard.logs import Excerpt, excerpts
from service.web.dashboard.reproduce import local_command, submit_command
from service.web.dashboard.runpage import load_run

# Phase-document info keys that describe the software a phase actually ran with.
VERSION_KEYS = ("megatron_core", "torch", "python", "platform", "device", "backend", "world_size", "cpu_shims")
# which phase an error's stage belongs to, when the error does not say
LOAD_STAGES = frozenset({"load"})


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


def diff(good: dict[str, Any], this: dict[str, Any], *, keep_order: bool = False) -> list[Change]:
    """Key-by-key comparison of two flat mappings, changed keys first (in this's order when keep_order)."""
    keys = [*this, *(k for k in good if k not in this)] if keep_order else sorted(set(good) | set(this))
    rows = [Change(k, good.get(k), this.get(k)) for k in keys]
    return rows if keep_order else sorted(rows, key=lambda c: not c.changed)


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


def artifacts_of(env: Environment) -> str | None:
    """The sha256 of the uploaded build(s) an environment was made from (`artifact:<sha256>` lines), if any."""
    shas = [line.split(":", 1)[1].split()[0] for line in env.requirements or [] if line.startswith("artifact:")]
    return ", ".join(shas) or None


def environment_facts(run: Run) -> dict[str, Any]:
    """The build a run ran on, its identity first: Megatron-Core version, the uploaded artifact's sha256, the
    commit, then the environment, Python and torch versions (no interpreter paths: they differ per build)."""
    env: Environment = run.environment
    ran = packages(run)
    return {
        "megatron-core": ran.get("megatron-core") or env.megatron_core,
        "artifact sha256": artifacts_of(env),
        "commit": (run.labels or {}).get("commit"),
        "environment": env.name,
        "python version": ran.get("python") or (env.packages or {}).get("python_version"),
        "torch": ran.get("torch") or env.torch,
    }


def freeze_diff(good: Environment, this: Environment) -> dict[str, Any]:
    """pip freeze of the two environments compared by package: changed, added, removed."""
    def parse(lines: list[str]) -> dict[str, str]:
        out = {}
        for line in lines or []:
            name, sep, version = str(line).partition("==")
            if not sep:  # `name @ file:///…/name-1.2.whl`: a direct reference, compared by where it points
                name, _, version = str(line).partition(" @ ")
            out[name.strip().lower()] = version.strip()
        return out

    a, b = parse(good.freeze), parse(this.freeze)
    return {
        "known": bool(a) and bool(b),
        "same_environment": good.id == this.id,
        "changed": [Change(k, a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]],
        "added": [f"{k}=={b[k]}" for k in sorted(set(b) - set(a))],
        "removed": [f"{k}=={a[k]}" for k in sorted(set(a) - set(b))],
    }


def nearest_good(session: Session, run: Run) -> Run | None:
    """For a run with no good history on its track: the latest passing run of the same config (any check,
    e.g. with a workaround), its own track first — context, not "last good"."""
    query = (select(Run).options(selectinload(Run.environment))
             .where(Run.config == run.config, Run.verdict == PASS, Run.id != run.id, Run.finished_at.is_not(None))
             .order_by((Run.track == run.track).desc(), Run.finished_at.desc(), Run.id.desc()).limit(1))
    return session.scalar(query)


def _fingerprint_rows(session: Session, run_id: int) -> list[dict[str, Any]]:
    rows = session.scalars(select(ProbeFinding).where(ProbeFinding.run_id == run_id,
                                                      ProbeFinding.probe.like("%fingerprints"),
                                                      ProbeFinding.param_name.is_not(None)))
    return [{"param": f.param_name, **(f.detail or {})} for f in rows]


def explained(run: Run, hows: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The run's signatures and advisories with their meaning, references, evidence and a finding sentence."""
    summary = read_summary(run.summary)
    evidence = summary.get("evidence") or {}
    lines = summary.get("cause_lines") or {}
    out = []
    for name in [*run.signatures, *(summary.get("advisories") or [])]:
        sig = SIGNATURES.get(name)  # type: ignore[call-overload]  # stored names may predate the table
        title = sig.title if sig else name
        found = evidence.get(name)
        out.append({
            "name": name,
            "title": title,
            "meaning": _at_the_step(sig.meaning, name, run, summary) if sig
            else "Not in this service's signature table.",
            "kind": sig.kind if sig else "unknown",
            "references": list(sig.references) if sig else [],
            "evidence": found,
            # what the resume lost (section, state-dict name, how), as the verdict wrote it
            "cause_line": lines.get(name),
            "finding": sentence(title, found, hows or {}) if found else None,
        })
    return out


def _at_the_step(meaning: str, name: str, run: Run, summary: Mapping[str, Any]) -> str:
    """A signature's meaning with "at some step" made the step this run measured, where it is known."""
    lr_steps = (summary.get("lanes") or {}).get("lr_mismatched_steps") or []
    step = lr_steps[0] if name == LR_SCHEDULE_MISMATCH and lr_steps else run.first_divergent_step
    return meaning.replace("at some step", f"from step {step} on") if step is not None else meaning


def resume_ran(run: Run) -> bool:
    """Whether the resume phase produced any result (a crashed save means it never started)."""
    phases = read_summary(run.summary).get("phases") or {}
    return bool(phases.get("resume")) or any(p.name == "resume" and p.state == "succeeded" for p in run.phases)


def failing_phase(run: Run, errors: list[Any]) -> str | None:
    """The phase the failure happened in: the error's own phase, its stage (load: resume), else the failed one."""
    for e in errors:
        if e.get("phase"):
            return str(e["phase"])
        if e.get("stage") in LOAD_STAGES:
            return "resume"
        if e.get("stage") == "save" or not resume_ran(run):
            return "train_and_save"
    failed = [p.name for p in run.phases if p.state in ("failed", "infra_failed")]
    return failed[0] if failed else None


def failure_logs(run: Run, run_folder: Path, phase_name: str | None = None) -> list[tuple[str, int, Excerpt]]:
    """Excerpts from the failing phase (else the failed phases, else the last). -> (phase, id, excerpt)."""
    chosen = [p for p in run.phases if p.name == phase_name] if phase_name else []
    chosen = chosen or [p for p in run.phases if p.state in ("failed", "infra_failed")] or run.phases[-1:]
    # with process isolation one job serves both phases: head each excerpt by the phase its file is from
    return [(_phase_of(e.path, p.name), p.id, e) for p in chosen for e in excerpts(p, run_folder)]


def _phase_of(path: str, default: str) -> str:
    parts = Path(path).parts
    return next((name for name in ("train_and_save", "resume", "uninterrupted") if name in parts), default)


def triage(session: Any, run_id: int, *, run_folder: Path, base_url: str) -> dict[str, Any]:
    """Everything the triage page shows."""
    run = load_run(session, run_id, with_phases=True)
    good = load_run(session, run.last_good_run_id) if run.last_good_run_id else None
    context = None if good else nearest_good(session, run)
    summary = read_summary(run.summary)
    errors = summary.get("errors") or []
    env = environment_facts(run)
    return {
        "run": run,
        "failed": run.verdict in NOT_PASSED or run.state in ("failed", "error"),
        "signatures": explained(run, fingerprint_hows(_fingerprint_rows(session, run.id))),
        "errors": errors,
        "crash_explained": next(filter(None, (explain_crash(e.get("message")) for e in errors)), None)
        or explain_crash(run.error_message),
        "resume_ran": resume_ran(run),
        "good": good,
        "compared_track": run.compared_track or run.track,
        "context_good": context,
        "this_env": env,
        "env_diff": diff(environment_facts(good), env, keep_order=True) if good else [],  # the build's identity first
        "freeze_diff": freeze_diff(good.environment, run.environment) if good else None,
        "spec_diff": diff(good.spec, run.spec) if good else [],
        "label_diff": diff(good.labels or {}, run.labels or {}) if good else [],
        "package_diff": diff(packages(good), packages(run)) if good else [],
        "local_command": local_command(run.spec, environment=run.environment.name, url=base_url),
        "python_command": local_command(run.spec, python=run.environment.python),
        "submit_command": submit_command(run.spec, environment=run.environment.name, labels=run.labels or {},
                                         base_url=base_url, repro_of=run.id),
        "python": run.environment.python,
        "logs": failure_logs(run, run_folder, failing_phase(run, errors)),
    }
