"""Known upstream bugs: a run whose only signatures are known on its environment is `known-failure`,
and a run where a known failure stopped happening is flagged `fixed?` (never commits)."""

from __future__ import annotations

from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.verdict.signatures import SIGNATURES
from jobs.verdict_names import FAILED, KNOWN_FAILURE
from models import Environment, KnownFailure, Run
from models.base import utcnow
from service.core.errors import InvalidSpec, NotFound


def create(session: Session, *, signature: str, environments: list[str], mcore_versions: str, link: str,
           note: str = "", created_by: str | None = None) -> KnownFailure:
    """Record "on these environments / builds, signature S is known: link"."""
    if signature not in SIGNATURES:
        raise InvalidSpec(f"signature: unknown {signature!r}; allowed: {', '.join(sorted(SIGNATURES))}",
                          field="signature")
    try:
        SpecifierSet(mcore_versions)
    except InvalidSpecifier:
        raise InvalidSpec(f"mcore_versions: not a version range like '<=0.16.1' or '>=0.15,<0.17': "
                          f"{mcore_versions!r}", field="mcore_versions") from None
    if not link.startswith(("http://", "https://")):
        raise InvalidSpec(f"link: expected an http(s) URL, got {link!r}", field="link")
    if not environments and not mcore_versions:
        raise InvalidSpec("environments: name at least one environment or give mcore_versions", field="environments")
    row = KnownFailure(signature=signature, environments=sorted(set(environments)), mcore_versions=mcore_versions,
                       link=link, note=note, created_by=created_by)
    session.add(row)
    session.flush()
    return row


def retire(session: Session, known_id: int) -> KnownFailure:
    """Stop treating an entry as known (upstream fixed it)."""
    row = session.get(KnownFailure, known_id)
    if row is None:
        raise NotFound(f"known failure {known_id} does not exist", field="known_failure_id")
    row.retired_at = row.retired_at or utcnow()
    session.flush()
    return row


def list_known(session: Session, *, include_retired: bool = False) -> list[KnownFailure]:
    """Entries, newest first."""
    query = select(KnownFailure).order_by(KnownFailure.id.desc())
    if not include_retired:
        query = query.where(KnownFailure.retired_at.is_(None))
    return list(session.scalars(query))


def _applies(entry: KnownFailure, environment: str, build: str | None) -> bool:
    if entry.environments and environment not in entry.environments:
        return False
    if entry.mcore_versions:
        if not build:
            return False
        try:
            return Version(build) in SpecifierSet(entry.mcore_versions, prereleases=True)
        except InvalidVersion:
            return False
    return True


def build_of(run: Run, environment: Environment | None) -> str | None:
    """The Megatron-Core version a run used: as its phases recorded it, else as the environment last did."""
    packages = (run.summary or {}).get("packages") or {}
    env_packages = environment.packages if environment is not None else {}
    version = packages.get("megatron_core") or env_packages.get("megatron_core") or env_packages.get("megatron-core")
    return str(version) if version else None


def _ref(entry: KnownFailure) -> dict[str, Any]:
    return {"id": entry.id, "signature": entry.signature, "link": entry.link}


def apply(session: Session, run: Run) -> None:
    """Turn a failure explained only by known signatures into `known-failure`; flag `fixed?` entries."""
    environment = session.get(Environment, run.environment_id)
    env_name = environment.name if environment is not None else ""
    build = build_of(run, environment)
    active = [e for e in list_known(session) if _applies(e, env_name, build)]
    if not active:
        return
    known = {e.signature: e for e in active}
    summary = dict(run.summary or {})
    signatures = list(run.signatures or [])
    if run.verdict in FAILED and signatures and all(s in known for s in signatures):
        summary["known_failures"] = [_ref(known[s]) for s in signatures]
        summary["verdict_before_known"] = run.verdict
        run.verdict = KNOWN_FAILURE
    # fixed?: the previous run of this check on this track showed a known signature this one lacks
    previous = session.scalar(
        select(Run).where(Run.check_key == run.check_key, Run.track == run.track, Run.id != run.id,
                          Run.verdict.is_not(None))
        .order_by(Run.finished_at.desc().nulls_last(), Run.id.desc()).limit(1)
    )
    if previous is not None and previous.verdict == KNOWN_FAILURE:
        gone = [known[s] for s in previous.signatures or [] if s in known and s not in signatures]
        if gone:
            summary["known_fixed"] = [_ref(e) for e in gone]
    run.summary = summary
