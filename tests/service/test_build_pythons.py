"""A build's venv is made on the Python its requirements' Requires-Python needs (service/environments/interpreters.py).

Real interpreters, real pip, a tiny wheel built here per case (no torch, no index): the CI-sized
check of what the release table's 3.12 builds rely on (a 3.12 build with its CUDA torch does not fit
a fresh machine's CI budget; the table is a command run and reported, docs/releases.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from service.environments import interpreters
from service.environments.build_steps import BuildResultError, read_build_result
from service.environments.recipe import build_environment, pick_python
from service.environments.requirements import content_hash
from tests.plugins.wheels import write_wheel

pytestmark = pytest.mark.timeout(1200)  # past the 300 s ceiling: real builds or many real runs

OWN = f"{sys.version_info.major}.{sys.version_info.minor}"


def _newer() -> tuple[str, str]:
    newer = [(v, p) for v, p in interpreters.configured(None).items() if v != OWN]
    if not newer:
        pytest.skip(f"no Python newer than {OWN} on this machine (PATH or pyenv): scripts/setup.sh lists what it finds")
    return newer[0]


def make_wheel(folder: Path, name: str, requires_python: str) -> Path:
    """A pure-Python wheel `name` 1.0 whose metadata says Requires-Python: requires_python."""
    return write_wheel(folder, name, "1.0", {f"{name}/__init__.py": "VALUE = 1\n"}, requires_python=requires_python)


def _venv_with(python: str, wheel: Path, venv: Path) -> str:
    """Make a venv on python, install the wheel with pip honouring Requires-Python; return the venv's version."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index",
                    "--no-deps", "--quiet", str(wheel)], check=True)
    return subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.nightly
@pytest.mark.slow  # five pip runs on two interpreters: ~40 s on a loaded machine
def test_requires_python_picks_the_lowest_python_that_fits(tmp_path: Path) -> None:
    newer, newer_path = _newer()
    pythons = interpreters.configured(None)
    log = tmp_path / "build.log"
    new = make_wheel(tmp_path / "w", "tiny_new", f">={newer}")
    old = make_wheel(tmp_path / "w", "tiny_old", f"<{newer}")
    any_ = make_wheel(tmp_path / "w", "tiny_any", ">=3.8")

    assert pick_python([str(new)], pythons, log) == (newer, newer_path)
    assert pick_python([str(old)], pythons, log)[0] == OWN
    assert pick_python([str(any_)], pythons, log)[0] == OWN  # the lowest that fits, not the newest
    assert pick_python([str(any_), str(new)], pythons, log)[0] == newer  # every line must fit
    assert f"Requires-Python of tiny_new 1.0: >={newer}" in log.read_text()
    # the venv made on the chosen Python really takes the wheel (pip checks Requires-Python here), and
    # the service's own Python really refuses it: the choice is not a label
    assert _venv_with(newer_path, new, tmp_path / "v-new") == newer
    refused = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", str(new)],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "requires a different Python" in refused.stderr


def test_a_wheel_built_for_one_python_picks_that_python_from_its_tags(tmp_path: Path) -> None:
    # an uploaded wheel is read as a file (no pip started): a cp3XY-only wheel with no Requires-Python
    # still goes to that Python, never to one whose installer would refuse its tags
    newer, newer_path = _newer()
    plain = make_wheel(tmp_path / "w", "tiny_tagged", "")
    tag = f"cp{newer.replace('.', '')}"
    tagged = plain.rename(plain.with_name(f"tiny_tagged-1.0-{tag}-{tag}-manylinux_2_28_x86_64.whl"))
    log = tmp_path / "build.log"
    assert pick_python([str(tagged)], interpreters.configured(None), log) == (newer, newer_path)
    assert "Requires-Python of tiny_tagged 1.0: (none)" in log.read_text()
    with pytest.raises(interpreters.NoPythonFits, match="its tags name another Python"):
        pick_python([str(tagged)], {OWN: interpreters.own_python()[1]}, log)


def test_no_python_fits_fails_the_build_naming_the_field_and_the_pythons(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "tiny_future", ">=3.99")
    folder = tmp_path / "environments" / "b1"
    with pytest.raises(interpreters.NoPythonFits):
        build_environment(str(folder), [str(wheel)], interpreters.configured(None))
    with pytest.raises(BuildResultError) as err:  # what the scheduler reads back and shows on the environment
        read_build_result(folder)
    message = str(err.value)
    assert "Requires-Python" in message and "tiny_future 1.0" in message and "'>=3.99'" in message
    assert "PARITY_PYTHONS" in message and f"{OWN} (" in message
    assert not (folder / "venv").exists()  # refused before any venv was made


def test_metadata_pip_cannot_read_fails_the_build_with_pips_reason(tmp_path: Path) -> None:
    broken = tmp_path / "w" / "tiny_broken-1.0-py3-none-any.whl"
    broken.parent.mkdir()
    broken.write_bytes(b"not a zip\x00" * 10)
    folder = tmp_path / "environments" / "b2"
    with pytest.raises(interpreters.MetadataUnreadable):
        build_environment(str(folder), [str(broken)], interpreters.configured(None))
    with pytest.raises(BuildResultError, match="reading Requires-Python of the requirements failed"):
        read_build_result(folder)


def test_an_invalid_requires_python_is_named() -> None:
    with pytest.raises(interpreters.NoPythonFits, match=r"tiny 1.0: Requires-Python '>=three' is not a valid"):
        interpreters.choose([("tiny", "1.0", ">=three")], {OWN: sys.executable})


@pytest.mark.parametrize(("value", "why"), [
    ("3.12", "is not X.Y=/absolute/path"),
    ("python3.12=/usr/bin/python3.12", "is not X.Y=/absolute/path"),
    ("3.12=python3.12", "is not X.Y=/absolute/path"),
    ("3.12=/usr/bin/py thon", "is not X.Y=/absolute/path"),
    ("3.12=/usr/bin/python3.12\x00;rm", "is not X.Y=/absolute/path"),
    ("3.99999999999999999999=/bin/true", "is not X.Y=/absolute/path"),
    ("3.10=/usr/bin/python3.10", "older than the service's Python"),
    ("3.12=/bin/false", "runs as nothing"),
    (f"3.13={sys.executable}", f"runs as {OWN}."),  # a path that lies about its version
])
def test_parity_pythons_is_checked(value: str, why: str) -> None:
    with pytest.raises(interpreters.PythonsError) as err:
        interpreters.parse(value)
    assert str(err.value).startswith("PARITY_PYTHONS: ") and why in str(err.value)


def test_configured_set_always_holds_the_service_python_and_keys_the_build_hash() -> None:
    newer, newer_path = _newer()
    pythons = interpreters.configured(f"{newer}={newer_path}")
    assert list(pythons) == [OWN, newer]
    assert pythons[OWN] == interpreters.own_python()[1]
    # with the service's Python alone the hash is what it always was: existing 3.11 builds stay reused
    only_own = interpreters.versions_key(interpreters.configured(f"{OWN}={interpreters.own_python()[1]}"))
    assert only_own == OWN
    lines = ["megatron-core==0.19.2"]
    assert content_hash(lines, torch_version="2.13.0", python_version=interpreters.versions_key(pythons)) != \
        content_hash(lines, torch_version="2.13.0", python_version=OWN)


def test_the_build_records_the_python_it_chose(tmp_path: Path) -> None:
    folder = tmp_path / "b"
    folder.mkdir()
    doc = {"python": str(folder / "venv" / "bin" / "python"), "torch": "2.13.0", "megatron_core": "0.19.2",
           "freeze": [], "seconds": 1.0, "python_version": "3.12.1"}
    (folder / "build.json").write_text(json.dumps(doc))
    assert read_build_result(folder)["python_version"] == "3.12.1"
    (folder / "build.json").write_text(json.dumps({**doc, "python_version": "3" * 100}))
    with pytest.raises(BuildResultError, match="python_version is not a version string"):
        read_build_result(folder)
