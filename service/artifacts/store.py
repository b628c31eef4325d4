"""Uploaded builds: stored once per SHA-256 under the artifact folder, resolved for builds, pruned when unused.

The bytes land in `<folder>/.incoming/` while they stream in (hashed on the way), then move to
`<folder>/<sha256>/<filename>` (pip reads a wheel's tags from its name). The same bytes uploaded again
keep the first file and row.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import ApiToken, Artifact, Environment
from models.base import utcnow
from service.artifacts.lines import artifact_sha
from service.core.errors import DomainError, NotFound, PayloadTooLarge, QuotaExceeded
from service.core.settings import Settings

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]{0,254}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# what the first bytes of each kind must be: a wheel (and a .zip sdist) is a zip, a .tar.gz is gzip
MAGIC = {".whl": b"PK\x03\x04", ".zip": b"PK\x03\x04", ".tar.gz": b"\x1f\x8b"}
class InvalidArtifact(DomainError):
    status_code = 422
    code = "invalid_artifact"


@dataclass(frozen=True)
class Allowance:
    """How much one upload may still bring: the artifact limit, or what is left of its token's quota."""

    limit: int
    # the error once `limit` is passed (413 for the artifact limit, the quota's 429 otherwise)
    refusal: DomainError


def _stored_by(session: Session, token_id: int) -> tuple[int, int]:
    """(artifacts, bytes) stored from this token's uploads."""
    count, size = session.execute(select(func.count(), func.coalesce(func.sum(Artifact.size_bytes), 0)).where(
        Artifact.token_id == token_id, Artifact.state == "stored")).one()
    return int(count), int(size)


def _quota_check(session: Session, token: ApiToken, settings: Settings, adding: int | None) -> int:
    """The bytes left to the token's quota once `adding` more are stored; QuotaExceeded naming the setting if none.

    `adding` None: before the body, when the bytes may turn out to be stored already (free): only a
    token with no byte left is refused then; the number of artifacts is counted once the bytes are new.
    """
    count, size = _stored_by(session, token.id)
    most_bytes = settings.token_max_artifact_bytes_int
    keep = f"retention deletes an artifact unused for PARITY_ARTIFACT_KEEP_DAYS={settings.artifact_keep_days:g} days"
    if adding is not None and count + 1 > settings.token_max_artifacts:
        raise QuotaExceeded(
            f"body: token {token.name!r} already stores {count} artifacts "
            f"(PARITY_TOKEN_MAX_ARTIFACTS={settings.token_max_artifacts}); {keep}", field="body")
    if size + (adding or 0) > most_bytes or (adding is None and size >= most_bytes):
        brings = f" and this upload brings {adding}" if adding is not None else ""
        raise QuotaExceeded(
            f"body: token {token.name!r} stores {size} bytes of artifacts{brings} "
            f"(PARITY_TOKEN_MAX_ARTIFACT_BYTES={settings.token_max_artifact_bytes}); {keep}", field="body")
    return most_bytes - size - (adding or 0)


def allowance(session: Session, *, token: ApiToken, settings: Settings) -> Allowance:
    """What one upload of this token may bring (checked before its body is read; QuotaExceeded if nothing)."""
    too_large = PayloadTooLarge(
        f"request body: larger than the {settings.artifact_max_bytes} bytes allowed for an artifact "
        "(PARITY_ARTIFACT_MAX_BYTES)")
    if "admin" in token.scopes:
        return Allowance(settings.artifact_max_bytes, too_large)
    left = _quota_check(session, token, settings, None)
    if left >= settings.artifact_max_bytes:
        return Allowance(settings.artifact_max_bytes, too_large)
    return Allowance(left, QuotaExceeded(
        f"body: this upload is larger than the {left} bytes left to token {token.name!r} "
        f"(PARITY_TOKEN_MAX_ARTIFACT_BYTES={settings.token_max_artifact_bytes})", field="body"))


def check_filename(filename: str) -> str:
    """'wheel' or 'sdist' for a valid file name (tags and version parse), else 422 naming what is allowed."""
    if not SAFE_NAME.match(filename or ""):
        raise InvalidArtifact(
            f"filename: {filename[:100]!r} must be 1..255 letters, digits and ._+!- (no path)", field="filename")
    try:
        if filename.endswith(".whl"):
            parse_wheel_filename(filename)
            return "wheel"
        if filename.endswith((".tar.gz", ".zip")):
            parse_sdist_filename(filename)
            return "sdist"
    except (InvalidWheelFilename, InvalidSdistFilename) as exc:
        raise InvalidArtifact(f"filename: {exc}", field="filename") from None
    raise InvalidArtifact(
        f"filename: {filename!r} is neither a wheel (.whl) nor an sdist (.tar.gz, .zip)", field="filename")


@dataclass
class Received:
    """An upload written to a temporary file: its hash and size."""

    temp: Path
    sha256: str
    size: int


# the artifact folder may be passed (a build job reads its own wheel by its sha256), never listed: a job
# must not enumerate every tenant's uploads
ROOT_MODE = 0o711
STORED_MODE = 0o700  # an artifact's own folder: the service's alone


def incoming(settings: Settings) -> Path:
    """A fresh temporary path for one upload (inside the artifact folder, so the final move is a rename)."""
    root = settings.resolved_artifact_folder
    root.mkdir(parents=True, exist_ok=True, mode=ROOT_MODE)
    if root.stat().st_mode & 0o777 != ROOT_MODE:
        root.chmod(ROOT_MODE)
    folder = root / ".incoming"
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder / uuid.uuid4().hex


class Writer:
    """Write an upload's chunks to a temporary file, hashing them, refusing more than its allowance."""

    def __init__(self, temp: Path, allowed: Allowance) -> None:
        self.temp, self.limit, self.refusal, self.size = temp, allowed.limit, allowed.refusal, 0
        self.hash = hashlib.sha256()
        self.fh: BinaryIO = temp.open("wb")

    def write(self, chunk: bytes) -> None:
        """Append a chunk (the allowance's refusal, and the file removed, once the limit is passed)."""
        self.size += len(chunk)
        if self.size > self.limit:
            self.discard()
            raise self.refusal
        self.hash.update(chunk)
        self.fh.write(chunk)

    def finish(self) -> Received:
        """Close the file and return what was received."""
        self.fh.close()
        return Received(self.temp, self.hash.hexdigest(), self.size)

    def discard(self) -> None:
        """Close and delete the temporary file."""
        self.fh.close()
        self.temp.unlink(missing_ok=True)


def store(session: Session, *, received: Received, filename: str, token: ApiToken | None,
          settings: Settings) -> tuple[Artifact, bool]:
    """Keep the received file under its hash (once), counted in the quota of the token that brought it first.

    -> (artifact, newly stored). The quota is checked again here under a lock on the token's row, so
    concurrent uploads of one token cannot both pass it.
    """
    try:
        kind = check_filename(filename)
        if received.size == 0:
            raise InvalidArtifact("body: the upload is empty", field="body")
        with received.temp.open("rb") as fh:
            head = fh.read(4)
        magic = next(m for suffix, m in MAGIC.items() if filename.endswith(suffix))
        if not head.startswith(magic):
            raise InvalidArtifact(f"body: {filename!r} does not look like a {kind} (wrong file signature)",
                                  field="body")
        session.execute(insert(Artifact).values(
            sha256=received.sha256, filename=filename, kind=kind, size_bytes=received.size, state="pruned",
            path=str(settings.resolved_artifact_folder / received.sha256 / filename),
            uploaded_by=token.name if token else None, token_id=token.id if token else None,
            created_at=utcnow(), last_used_at=utcnow(),
        ).on_conflict_do_nothing(index_elements=["sha256"]))
        art = session.scalar(select(Artifact).where(Artifact.sha256 == received.sha256).with_for_update()
                             .execution_options(populate_existing=True))
        assert art is not None
        new = art.state != "stored"
        if new and token is not None and "admin" not in token.scopes:
            session.execute(select(ApiToken.id).where(ApiToken.id == token.id).with_for_update())
            _quota_check(session, token, settings, received.size)
            art.token_id, art.uploaded_by = token.id, token.name  # bytes brought back count for who brought them
        if new or not Path(art.path).is_file():
            dest = Path(art.path)
            # the service's only: a job (any tenant's build) must not read another tenant's wheel; a build
            # gets a copy of its own wheels in its folder (service/environments/build_steps.py)
            dest.parent.mkdir(parents=True, exist_ok=True, mode=STORED_MODE)
            dest.parent.chmod(STORED_MODE)
            os.replace(received.temp, dest)
            dest.chmod(0o600)
            art.state, new = "stored", True
        art.last_used_at = utcnow()
        session.flush()
        return art, new
    finally:
        received.temp.unlink(missing_ok=True)


def get_artifact(session: Session, *, sha256: str) -> Artifact:
    """The artifact with this hash, or 404."""
    art = session.scalar(select(Artifact).where(Artifact.sha256 == sha256))
    if art is None:
        raise NotFound(f"sha256: no artifact {sha256[:64]!r} was uploaded", field="sha256")
    return art


def list_artifacts(session: Session, *, limit: int = 100, token_id: int | None = None) -> list[Artifact]:
    """The newest artifacts first (only those counted for `token_id` when given)."""
    query = select(Artifact)
    if token_id is not None:
        query = query.where(Artifact.token_id == token_id)
    return list(session.scalars(query.order_by(Artifact.created_at.desc()).limit(limit)))


def resolve_lines(session: Session, lines: Iterable[str], *, touch: bool = True) -> list[str]:
    """Requirement lines with each `artifact:<sha256>` replaced by its stored file's path.

    Raises InvalidArtifact (naming the line) for an artifact never uploaded or already pruned.
    """
    out = []
    for i, line in enumerate(lines):
        sha = artifact_sha(line)
        if sha is None:
            out.append(line)
            continue
        art = session.scalar(select(Artifact).where(Artifact.sha256 == sha))
        if art is None or art.state != "stored" or not Path(art.path).is_file():
            what = "was never uploaded" if art is None else "was deleted by retention"
            raise InvalidArtifact(
                f"requirements[{i}]: {line} {what}; upload it again (POST /api/v1/artifacts, "
                "parity submit --wheel)", field=f"requirements[{i}]")
        if touch:
            art.last_used_at = utcnow()
        out.append(art.path)
    return out


def prune_artifacts(session: Session, *, settings: Settings) -> list[str]:
    """Delete the files of artifacts no build asked for in artifact_keep_days (and none is building)."""
    cutoff = utcnow() - timedelta(days=settings.artifact_keep_days)
    arts = session.scalars(select(Artifact).where(
        Artifact.state == "stored", Artifact.last_used_at < cutoff).with_for_update(skip_locked=True)).all()
    if not arts:
        return []
    busy = {
        sha for reqs in session.scalars(select(Environment.requirements).where(
            Environment.state.in_(("pending", "building")), Environment.requirements.is_not(None)))
        for sha in (artifact_sha(line) for line in reqs or []) if sha
    }
    pruned = []
    for art in arts:
        if art.sha256 in busy:
            continue
        shutil.rmtree(Path(art.path).parent, ignore_errors=True)
        art.state = "pruned"
        pruned.append(art.sha256)
    return pruned

