"""A folder the service's tree links to is bound back into a local job's sandbox, like the tree itself.

The PR tier's main-snapshot builds link <run folder>/environments/pythons to a Python base prepared once
per machine under /var/tmp; behind a job's own /var/tmp that link dangled and every build on it failed
("File exists: …/environments/pythons").
"""

from __future__ import annotations

from pathlib import Path

from service.executors.launcher import linked_targets


def test_the_links_of_the_run_folder_and_its_builds_folder_are_found(tmp_path: Path) -> None:
    shared = tmp_path / "var-tmp" / "parity-ci" / "pythons"
    shared.mkdir(parents=True)
    root = tmp_path / "runs"
    (root / "environments").mkdir(parents=True)
    (root / "environments" / "pythons").symlink_to(shared)
    (root / "artifacts").symlink_to(tmp_path / "var-tmp")
    (root / "run-1").mkdir()
    (root / "run-1" / "linked").symlink_to(tmp_path)  # run folders are not walked
    assert sorted(linked_targets(root)) == sorted([shared.resolve(), (tmp_path / "var-tmp").resolve()])
    assert linked_targets(tmp_path / "absent") == []
