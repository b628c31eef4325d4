"""Upload a wheel or sdist to POST /api/v1/artifacts, streamed from disk; its requirement line comes back."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

CHUNK = 1024 * 1024


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def upload(http: httpx.Client, path: Path) -> dict[str, Any]:
    """Upload the file (stored once per content); the artifact, or SystemExit(2) naming the error."""
    if not path.is_file():
        raise SystemExit(f"parity: artifact: {path} is not a file")
    resp = http.post("/api/v1/artifacts", params={"filename": path.name}, content=_chunks(path),
                     headers={"Content-Type": "application/octet-stream",
                              "Content-Length": str(path.stat().st_size)}, timeout=600)
    if resp.status_code not in (200, 201):
        try:
            body = resp.json()
            detail = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            detail = resp.text[:500]
        raise SystemExit(f"parity: uploading {path.name}: {resp.status_code} {detail}")
    art: dict[str, Any] = resp.json()
    print(f"artifact {path.name} {art['sha256'][:12]} ({'stored' if resp.status_code == 201 else 'already stored'}, "
          f"{art['size_bytes']} bytes): {art['requirement']}", file=sys.stderr)
    return art
