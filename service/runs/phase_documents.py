"""Validate the documents jobs/ returns against their contract (jobs/contract.py), and read stored ones.

Validation checks, it does not rewrite: the stored document is the one the job returned (fields
the contract does not name yet are kept). A document that fails names the first bad field.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from jobs.contract import (
    LOAD_NO_GRAD,
    ErrorRecord,
    ParityResult,
    PhaseDocument,
    PhaseName,
    PhaseSummary,
    SignatureId,
    error_record,
    phase_document,
)

PHASE_DOCUMENT: TypeAdapter[PhaseDocument] = TypeAdapter(PhaseDocument)
PARITY_RESULT: TypeAdapter[ParityResult] = TypeAdapter(ParityResult)


class InvalidDocument(ValueError):
    """A document that does not match its contract; `field` is the dotted path of the first bad key."""

    def __init__(self, what: str, exc: ValidationError) -> None:
        first = exc.errors()[0]
        self.field = ".".join(str(p) for p in first["loc"]) or "(document)"
        self.count = exc.error_count()
        more = f" (and {self.count - 1} more)" if self.count > 1 else ""
        super().__init__(f"{what} field {self.field}: {first['msg']}{more}")


def validate_phase_document(doc: Any) -> PhaseDocument:
    """Return `doc` unchanged if it is a valid phase document; raise InvalidDocument naming the field."""
    try:
        PHASE_DOCUMENT.validate_python(doc)
    except ValidationError as exc:
        raise InvalidDocument("phase document", exc) from None
    return doc  # type: ignore[no-any-return]


def validate_result(result: Any) -> ParityResult:
    """Return `result` unchanged if it is a valid parity result; raise InvalidDocument naming the field."""
    try:
        PARITY_RESULT.validate_python(result)
    except ValidationError as exc:
        raise InvalidDocument("parity result", exc) from None
    return result  # type: ignore[no-any-return]


def rejected_document(spec: dict[str, Any], phase: PhaseName, doc: Any, error: InvalidDocument) -> PhaseDocument:
    """The error document that stands in for a phase document that failed validation (kept in info)."""
    record = error_record("InvalidDocument", str(error), stage="ingest")
    out = phase_document(spec, phase, 0, status="error", error=record)
    out["info"] = {"rejected_document": doc}
    return out


class StoredSummary(TypedDict, total=False):
    """What the dashboard reads of `runs.summary` (the parity result less steps and probes)."""

    schema_version: int
    verdict: str
    signatures: list[SignatureId | str]
    advisories: list[SignatureId | str]
    worked_around: list[str]
    evidence: dict[str, Any]
    cause_lines: dict[str, str]  # signature -> what the resume lost, as the verdict wrote it
    errors: list[ErrorRecord]
    phases: dict[str, PhaseSummary | None]
    packages: dict[str, Any]


STORED_SUMMARY: TypeAdapter[StoredSummary] = TypeAdapter(StoredSummary)


def _upgrade_error(err: Any) -> Any:
    if isinstance(err, dict) and "all_ranks" in err:  # v1 named the cross-rank list all_ranks
        err = {k: v for k, v in err.items() if k != "all_ranks"} | {"rank_errors": err["all_ranks"]}
    if isinstance(err, dict):
        err = {"traceback": "", "stage": "job", "rank": None, **err}
        if isinstance(err.get("rank_errors"), list):
            err["rank_errors"] = [_upgrade_error(e) for e in err["rank_errors"]]
    return err


def upgrade_summary(summary: dict[str, Any] | None) -> dict[str, Any]:
    """Bring a stored summary of any schema version to the current one (version 1 had no version key)."""
    out = dict(summary or {})
    if out.get("schema_version", 1) < 2:
        if "errors" in out:
            out["errors"] = [_upgrade_error(e) for e in out["errors"] or []]
        if out.get("error"):
            out["error"] = _upgrade_error(out["error"])
        for name, phase in list((out.get("phases") or {}).items()):
            if not isinstance(phase, dict):
                continue
            phase = {"error": None, "info": {}, "stage_seconds": {}, "workarounds": {}, **phase}
            workarounds = dict(phase["workarounds"] or {})
            if "load-under-no-grad" in workarounds:  # v1's key for the load-no-grad workaround
                workarounds[LOAD_NO_GRAD] = workarounds.pop("load-under-no-grad")
            phase["workarounds"], phase["error"] = workarounds, _upgrade_error(phase["error"])
            out["phases"] = {**out["phases"], name: phase}
    return out


def read_summary(summary: dict[str, Any] | None) -> StoredSummary:
    """A stored summary, upgraded and checked; an unreadable one yields only an error saying so."""
    upgraded = upgrade_summary(summary)
    try:
        STORED_SUMMARY.validate_python(upgraded)
    except ValidationError as exc:
        bad = InvalidDocument("stored summary", exc)
        return {"errors": [error_record("InvalidDocument", str(bad), stage="ingest")]}
    return upgraded  # type: ignore[return-value]
