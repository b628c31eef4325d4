"""Small pure-Python wheels built in code for tests: what an installer checks (METADATA, WHEEL, a RECORD
with hashes), a fixed time stamp (the same files are the same bytes, hence the same SHA-256)."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from collections.abc import Mapping
from pathlib import Path

STAMP = (2026, 1, 1, 0, 0, 0)


def wheel_bytes(name: str, version: str, files: Mapping[str, str | bytes], *, requires_python: str = "") -> bytes:
    """The bytes of a py3-none-any wheel of distribution name==version holding files (path -> content)."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    members = {**files, f"{info}/METADATA": metadata,
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for member, content in members.items():
            data = content.encode() if isinstance(content, str) else content
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
            zf.writestr(zipfile.ZipInfo(member, STAMP), data)
        zf.writestr(zipfile.ZipInfo(f"{info}/RECORD", STAMP), "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return buf.getvalue()


def write_wheel(folder: Path, name: str, version: str, files: Mapping[str, str | bytes], *,
                requires_python: str = "") -> Path:
    """wheel_bytes written to folder under the wheel's standard file name; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    path.write_bytes(wheel_bytes(name, version, files, requires_python=requires_python))
    return path
