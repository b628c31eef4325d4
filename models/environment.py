"""What a run runs in: the environment, the uploaded artifacts and the sources it is built from."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, CreatedAt
from models.jsonsafe import SafeJSONB, SafeText


# An environment: the Python that runs job phases, how it came to be, and its package versions.
#
# Either registered (someone prepared `python` by hand; checked at registration) or built by the
# service from requirement lines (`requirements` set): then `state` moves pending → building →
# ready | failed, and `pruned` once its unused virtualenv is deleted.
class Environment(CreatedAt, Base):
    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Absolute path of the Python executable handed (quoted) to submitit, e.g. "/opt/mcore/bin/python".
    python: Mapped[str] = mapped_column(String(1000))
    description: Mapped[str] = mapped_column(String(2000), default="")
    # Package versions as recorded at registration/build and by the jobs that ran in it.
    packages: Mapped[dict[str, Any]] = mapped_column(SafeJSONB, default=dict)

    state: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready", index=True)
    # Built environments: the normalised requirement lines and their content hash (one build per set).
    requirements: Mapped[list[str] | None] = mapped_column(JSONB)
    content_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    folder: Mapped[str | None] = mapped_column(String(1000))
    executor: Mapped[str | None] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(SafeText)
    freeze: Mapped[list[str]] = mapped_column(SafeJSONB, default=list, server_default="[]")
    megatron_core: Mapped[str | None] = mapped_column(String(100))
    torch: Mapped[str | None] = mapped_column(String(100))
    build_seconds: Mapped[float | None]
    built_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    # the token that asked for this build (last): its build quota counts it while pending or building
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), index=True)
    # Built from a source's commit (service/environments/sources.py): which commit, when and what it was;
    # a plain source tree has a content hash for a commit and no subject
    source: Mapped[str | None] = mapped_column(String(100))
    source_commit: Mapped[str | None] = mapped_column(String(64), index=True)
    source_commit_date: Mapped[datetime | None]
    source_commit_subject: Mapped[str | None] = mapped_column(String(500))


# An uploaded build (a wheel or sdist), stored once per SHA-256 under the artifact folder.
#
# A requirement line `artifact:<sha256>` builds an environment from it. `state` is `stored` while the
# file is on disk and `pruned` once retention deleted it (uploading the same bytes again restores it).
class Artifact(CreatedAt, Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    # the file name pip needs to recognise it (a wheel's name carries its tags)
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(8))  # wheel | sdist
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(String(1000))
    uploaded_by: Mapped[str | None] = mapped_column(String(200))
    # the token whose upload stored these bytes first: its quota counts them (None: before 0016)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="SET NULL"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="stored", server_default="stored", index=True)
    last_used_at: Mapped[datetime | None]


# A source: where Megatron-LM's code comes from for builds of commits (a git URL or local repository
# at a ref, or a plain source tree), registered by an admin. Each resolved commit is one environment.
class Source(CreatedAt, Base):
    __tablename__ = "sources"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # git: a URL or a local repository, resolved at `ref` (branch, tag or commit); tree: a plain folder,
    # named by a hash of its content
    kind: Mapped[str] = mapped_column(String(8))
    location: Mapped[str] = mapped_column(String(1000))
    ref: Mapped[str | None] = mapped_column(String(200))
    created_by: Mapped[str | None] = mapped_column(String(200))
