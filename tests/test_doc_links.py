"""Every cross-reference in README, CONTRIBUTING, docs/ and the suite files resolves: relative links to files that
exist, `#anchors` to headings that exist, a suite file's `(path, "Section")` citations to a section there, and
every repository path README and CONTRIBUTING name in `code` to a tracked file, folder or module."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from jobs.config_listing import list_configs

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "jobs" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
SUITES = sorted((ROOT / "suites").glob("*.yaml"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITATION = re.compile(r"\(([\w./-]+|README), \"([^\"]+)\"\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# a word that names a repository path: a/b, a/b.py, a/ (a folder), or a bare file name with a known suffix
PATH_WORD = re.compile(r"^[\w.-]*(/[\w.-]*)+$|^[\w-]+\.(py|sh|md|ya?ml|toml|cfg|ini|json)$")
NOT_IN_REPO = ("/", "~", ".venv")  # absolute paths, the home folder and the made virtualenv are not the repo's


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The Markdown headings of a file (outside code fences)."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.append(m.group(1).strip())
    return out


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file (a repeated heading gets -1, -2, … as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        base = slug(h)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def broken_links(doc: Path) -> list[str]:
    """The relative links of a Markdown file that name a missing file or anchor."""
    bad = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            bad.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"{target}: no heading with anchor #{anchor}")
    return bad


@cache
def tracked_paths() -> frozenset[str]:
    """Every file of the repository (tracked, or new and not ignored) and every folder above one."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    return frozenset(files) | folders


def names_a_tracked_path(word: str, tracked: frozenset[str]) -> bool:
    """Whether a named path is in the repository: as written, under some folder (a slice's `core/`, a
    bare `group_commit.py`), or as a module with an attribute (`service/core/deps.get_session`)."""
    path = word.rstrip("/")
    candidates = {path, f"{path}.py"}
    if m := re.fullmatch(r"(.+)\.(\w+)", path):
        candidates.add(f"{m.group(1)}.py")
    return any(c in tracked or any(t.endswith(f"/{c}") for t in tracked) for c in candidates)


def missing_paths(doc: Path, tracked: frozenset[str]) -> list[str]:
    """The repository paths a Markdown file names in `code` that are not in the repository."""
    words = (w.strip("(),;:").rstrip(".") for span in CODE_SPAN.findall(doc.read_text()) for w in span.split())
    return [w for w in words if PATH_WORD.match(w) and not w.startswith(NOT_IN_REPO) and "<" not in w
            and not names_a_tracked_path(w, tracked)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.name)
def test_a_suite_file_cites_sections_that_exist(suite: Path) -> None:
    bad = []
    for where, section in CITATION.findall(suite.read_text()):
        target = ROOT / ("README.md" if where == "README" else where)
        if not target.exists():
            bad.append(f"{where}: no such file")
        elif not any(h.lower().startswith(section.lower()) for h in headings(target)):
            bad.append(f"{where}, {section!r}: no such section")
    assert bad == []


def test_the_checker_finds_a_broken_anchor_and_citation(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n## The table (2026)\n[ok](#the-table-2026) [gone](#nope) [file](missing.md)\n")
    assert broken_links(doc) == ["#nope: no heading with anchor #nope", "missing.md: no such file"]
    assert CITATION.findall('# (README, "The release table")') == [("README", "The release table")]


@pytest.mark.parametrize("doc", [ROOT / "README.md", ROOT / "CONTRIBUTING.md"], ids=lambda p: p.name)
def test_every_path_the_front_door_names_exists(doc: Path) -> None:
    assert missing_paths(doc, tracked_paths()) == []


def test_the_path_checker_finds_a_missing_path(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text("`service/core/db.py`, `core/` and `session_scope()` (`service/core/deps.get_session`), "
                   "`scripts/test.sh --fast`, `tests/test_gone.py`, `service/nowhere/`, `gone_module.py`, "
                   "`/var/tmp/x`, `<step>_rev<id>.py`\n")
    assert missing_paths(doc, tracked_paths()) == ["tests/test_gone.py", "service/nowhere/", "gone_module.py"]


def test_the_usage_page_names_every_config() -> None:
    text = (ROOT / "docs" / "usage.md").read_text()
    assert [c["name"] for c in list_configs() if f"`{c['name']}`" not in text] == []
