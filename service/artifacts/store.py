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
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from models import Artifact, Environment
from models.base import utcnow
from service.artifacts.lines import artifact_sha
from service.core.errors import DomainError, NotFound
from service.core.settings import Settings

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]{0,254}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# what the first bytes of each kind must be: a wheel (and a .zip sdist) is a zip, a .tar.gz is gzip
MAGIC = {".whl": b"PK\x03\x04", ".zip": b"PK\x03\x04", ".tar.gz": b"\x1f\x8b"}


class InvalidArtifact(DomainError):
    status_code = 422
    code = "invalid_artifact"


class PayloadTooLarge(DomainError):
    status_code = 413
    code = "payload_too_large"


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


def incoming(settings: Settings) -> Path:
    """A fresh temporary path for one upload (inside the artifact folder, so the final move is a rename)."""
    folder = settings.resolved_artifact_folder / ".incoming"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / uuid.uuid4().hex


class Writer:
    """Write an upload's chunks to a temporary file, hashing them, refusing more than `limit` bytes."""

    def __init__(self, temp: Path, limit: int) -> None:
        self.temp, self.limit, self.size = temp, limit, 0
        self.hash = hashlib.sha256()
        self.fh: BinaryIO = temp.open("wb")

    def write(self, chunk: bytes) -> None:
        """Append a chunk (413 and the file removed once the limit is passed)."""
        self.size += len(chunk)
        if self.size > self.limit:
            self.discard()
            raise PayloadTooLarge(f"request body: larger than the {self.limit} bytes allowed for an artifact")
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


def store(session: Session, *, received: Received, filename: str, uploaded_by: str | None,
          settings: Settings) -> tuple[Artifact, bool]:
    """Keep the received file under its hash (once); -> (artifact, newly stored)."""
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
            path=str(settings.resolved_artifact_folder / received.sha256 / filename), uploaded_by=uploaded_by,
            created_at=utcnow(), last_used_at=utcnow(),
        ).on_conflict_do_nothing(index_elements=["sha256"]))
        art = session.scalar(select(Artifact).where(Artifact.sha256 == received.sha256).with_for_update()
                             .execution_options(populate_existing=True))
        assert art is not None
        new = art.state != "stored"
        if new or not Path(art.path).is_file():
            dest = Path(art.path)
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            os.replace(received.temp, dest)
            dest.chmod(0o644)
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


def list_artifacts(session: Session, *, limit: int = 100) -> list[Artifact]:
    """The newest artifacts first."""
    return list(session.scalars(select(Artifact).order_by(Artifact.created_at.desc()).limit(limit)))


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

