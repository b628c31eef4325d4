"""Sources: a ref resolves to a commit (date, subject), each commit is one build reused when it repeats,
the build gets the commit's tree, and the commit is shown wherever the build is."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service.core.settings import get_settings
from service.environments import sources
from tests.plugins.git_repo import PYPROJECT, Repo


def _repo(tmp_path: Path) -> tuple[Repo, list[str]]:
    repo = Repo(tmp_path / "megatron-lm")
    shas = [repo.commit("Initial import", {"pyproject.toml": PYPROJECT, "megatron/core/__init__.py": "v = 1\n"}),
            repo.commit("Fix the scheduler", {"megatron/core/__init__.py": "v = 2\n"})]
    repo.git("tag", "v0.1", shas[0])
    return repo, shas


@pytest.mark.engine
def test_a_local_repository_resolves_its_ref_and_each_commit_is_one_reused_build(
    client: TestClient, make_token, db_session: Session, tmp_path: Path,
) -> None:
    repo, shas = _repo(tmp_path)
    resp = client.post("/api/v1/sources", json={"name": "mlm", "location": str(repo.path), "ref": "main"},
                       headers=make_token("admin"))
    assert resp.status_code == 201, resp.text
    assert resp.json()["kind"] == "git"
    settings = get_settings()
    source = sources.get_source(db_session, "mlm")
    head = sources.resolve(source, settings)
    assert head.sha == shas[1] and head.subject == "Fix the scheduler"
    assert head.date is not None and head.date.isoformat().startswith("2026-08-12")
    assert sources.resolve(source, settings, "v0.1").sha == shas[0]  # a tag names a commit too

    env = sources.commit_environment(db_session, source=source, commit=head, settings=settings)
    assert env.state == "pending" and env.name == f"mlm@{shas[1][:12]}"
    tree = Path((env.requirements or [""])[0])  # the build job's one line: the commit's files, exported by git archive
    assert (tree / "megatron/core/__init__.py").read_text() == "v = 2\n" and not (tree / ".git").exists()
    again = sources.commit_environment(db_session, source=source, commit=sources.resolve(source, settings),
                                       settings=settings)
    assert again.id == env.id  # the commit repeats: its build is reused
    older = sources.commit_environment(db_session, source=source, commit=sources.resolve(source, settings, "v0.1"),
                                       settings=settings)
    assert older.id != env.id and older.source_commit == shas[0]

    doc = client.get(f"/api/v1/environments/{env.name}").json()
    assert doc["source"] == "mlm" and doc["source_commit"] == shas[1]
    assert doc["source_commit_subject"] == "Fix the scheduler" and doc["source_commit_date"].startswith("2026-08-12")
    page = client.get(f"/environments/{env.name}")
    assert page.status_code == 200 and shas[1][:12] in page.text and "Fix the scheduler" in page.text


def test_commits_between_two_commits_oldest_first_and_a_bad_ref_says_why(
    db_session: Session, client: TestClient, make_token, tmp_path: Path,
) -> None:
    repo, shas = _repo(tmp_path)
    shas += [repo.commit("Third"), repo.commit("Fourth")]
    source = sources.register_source(db_session, name="mlm", location=str(repo.path), ref="main")
    between = sources.commits_between(source, get_settings(), shas[0], shas[3])
    assert [c.sha for c in between] == shas[1:] and [c.subject for c in between][0] == "Fix the scheduler"
    try:
        sources.resolve(source, get_settings(), "no-such-branch")
        raise AssertionError("an unknown ref resolved")
    except sources.SourceError as exc:
        assert "no-such-branch" in exc.detail
    bad = client.post("/api/v1/sources", json={"name": "x", "location": "relative/path"}, headers=make_token("admin"))
    assert bad.status_code == 422 and bad.json()["field"] == "location"
    assert client.post("/api/v1/sources", json={"name": "y", "location": str(repo.path)},
                       headers=make_token("submit")).status_code == 403


@pytest.mark.engine
def test_a_plain_tree_is_named_by_its_content(db_session: Session, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "megatron").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(PYPROJECT)
    (tree / "megatron" / "x.py").write_text("a = 1\n")
    source = sources.register_source(db_session, name="laptop", location=str(tree), ref=None)
    assert source.kind == "tree"
    settings = get_settings()
    first = sources.resolve(source, settings)
    env = sources.commit_environment(db_session, source=source, commit=first, settings=settings)
    assert sources.resolve(source, settings).sha == first.sha  # unchanged content: the same build
    (tree / "megatron" / "x.py").write_text("a = 2\n")
    second = sources.resolve(source, settings)
    assert second.sha != first.sha
    assert sources.commit_environment(db_session, source=source, commit=second, settings=settings).id != env.id


@pytest.mark.engine
def test_a_git_url_is_mirrored_and_fetched_each_time_it_is_resolved(db_session: Session, tmp_path: Path) -> None:
    repo, shas = _repo(tmp_path)
    source = sources.register_source(db_session, name="upstream", location=f"file://{repo.path}", ref=None)
    assert (source.kind, source.ref) == ("git", "main")  # a URL without a ref follows main
    settings = get_settings()
    assert sources.resolve(source, settings).sha == shas[1]
    assert (settings.resolved_run_folder / "sources" / "upstream.git" / "HEAD").exists()
    newer = repo.commit("Newer")
    assert sources.resolve(source, settings).sha == newer  # fetched again, not a stale mirror
    env = sources.commit_environment(db_session, source=source, commit=sources.resolve(source, settings),
                                     settings=settings)
    assert (Path((env.requirements or [""])[0]) / "CHANGES").read_text() == "Newer\n"
