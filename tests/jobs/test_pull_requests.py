"""The injected pull requests (jobs/selftest/pull_requests.py) still apply to the Megatron-LM main snapshot.

No build and no Megatron run: each PR's hunks are applied in order to the snapshot's own text (read
from the tarball), each `old` found exactly once, so a snapshot bump that moves a changed line fails
here, by name, and not as a gate run that silently tests clean main. Also: each PR names its
feature, the gate check that catches it, and signatures that exist.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml

from jobs.selftest.pull_requests import (
    FEATURES,
    GATED,
    JUDGED,
    PULL_REQUESTS,
    SNAPSHOT,
    UNJUDGEABLE,
    PullRequest,
)
from jobs.signature_names import SIGNATURE_IDS

ROOT = Path(__file__).resolve().parents[2]
NEW = [pr for pr in PULL_REQUESTS if pr.feature]


@pytest.fixture(scope="module")
def snapshot_text() -> dict[str, str]:
    """{path in the tree: text} for every file a PR changes, from the snapshot tarball."""
    if not SNAPSHOT.exists():
        pytest.skip(f"the Megatron-LM main snapshot is not at {SNAPSHOT} (PARITY_MEGATRON_SNAPSHOT)")
    wanted = {path for pr in PULL_REQUESTS for path, _, _ in pr.hunks}
    out: dict[str, str] = {}
    with tarfile.open(SNAPSHOT) as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if name in wanted and member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                out[name] = handle.read().decode()
    assert not wanted - set(out), f"the snapshot lacks {sorted(wanted - set(out))}"
    return out


@pytest.mark.parametrize("pr", PULL_REQUESTS, ids=lambda pr: pr.name)
def test_each_pull_request_applies_to_the_snapshot_exactly_once(pr: PullRequest, snapshot_text: dict[str, str],
                                                                tmp_path: Path) -> None:
    texts = dict(snapshot_text)
    for path, old, new in pr.hunks:
        assert texts[path].count(old) == 1, f"{pr.name}: {path} holds its changed lines {texts[path].count(old)} times"
        assert old != new
        texts[path] = texts[path].replace(old, new)
    # and PullRequest.apply does the same on a tree
    for path in {p for p, _, _ in pr.hunks}:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(snapshot_text[path])
    pr.apply(tmp_path)
    assert all((tmp_path / path).read_text() == texts[path] for path, _, _ in pr.hunks)
    for path in {p for p, _, _ in pr.hunks if p.endswith(".py")}:
        compile(texts[path], path, "exec")  # the patched source still parses


def test_apply_refuses_a_tree_without_the_changed_lines(tmp_path: Path) -> None:
    pr = PULL_REQUESTS[0]
    (tmp_path / pr.path).parent.mkdir(parents=True)
    (tmp_path / pr.path).write_text("nothing of the PR here\n")
    with pytest.raises(ValueError, match=pr.name):
        pr.apply(tmp_path)


def test_pull_requests_name_real_signatures_and_unique_names() -> None:
    assert len({pr.name for pr in PULL_REQUESTS}) == len(PULL_REQUESTS)
    for pr in PULL_REQUESTS:
        assert pr.causes and set(pr.causes) <= set(SIGNATURE_IDS), pr.name
        assert pr.title and len(pr.title.splitlines()) == 1, pr.name


def test_every_feature_has_a_pull_request_and_each_gated_one_names_a_gate_check() -> None:
    assert {pr.feature for pr in NEW} == set(FEATURES)
    assert set(UNJUDGEABLE) <= {pr.name for pr in PULL_REQUESTS}
    assert all(pr.check for pr in NEW if pr in GATED)
    gate = {c["name"] for c in yaml.safe_load((ROOT / "suites" / "gate.yaml").read_text())["checks"]}
    missing = {pr.name: pr.check for pr in GATED if pr.check and pr.check not in gate}
    assert not missing, f"PRs whose catching check is not in suites/gate.yaml: {missing}"
    # a PR of a suite beside the gate (a layout change the 60 s budget has no room for) names a check of it
    for pr in (pr for pr in JUDGED if pr.check):
        checks = {c["name"] for c in yaml.safe_load((ROOT / "suites" / f"{pr.suite}.yaml").read_text())["checks"]}
        assert pr.check in checks, f"{pr.name}: {pr.check} is not in suites/{pr.suite}.yaml"
