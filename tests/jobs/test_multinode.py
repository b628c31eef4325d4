"""Multi-node without a cluster: RunSpec.nodes, rank_nodes on merged documents, the rendezvous helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs.contract import phase_document
from jobs.documents import merge_rank_documents
from jobs.rank import multinode
from jobs.spec import RunSpec, SpecError, allowed_nodes
from service.core.checks import check_key, check_name
from service.runs.phase_documents import validate_phase_document

BASE = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


def test_nodes_defaults_to_one_and_is_left_out_of_the_stored_spec() -> None:
    spec = RunSpec.from_dict(BASE)
    assert spec.nodes == 1 and spec.tasks_per_node == 2
    assert "nodes" not in spec.to_dict()
    # an explicit 1 is the same check as no field at all
    explicit = RunSpec.from_dict({**BASE, "nodes": 1})
    assert explicit.to_dict() == spec.to_dict()
    assert check_key(explicit.to_dict()) == check_key(BASE)


def test_two_nodes_round_trip_and_make_another_check() -> None:
    spec = RunSpec.from_dict({**BASE, "nodes": 2})
    assert spec.tasks_per_node == 1
    data = spec.to_dict()
    assert data["nodes"] == 2
    assert RunSpec.from_dict(data) == spec
    assert check_key(data) != check_key(BASE)
    assert "nodes=2" in check_name(data)


@pytest.mark.parametrize(
    ("dp", "nodes", "allowed"),
    [(2, 3, [1, 2]), (2, 0, [1, 2]), (4, 3, [1, 2, 4]), (3, 2, [1, 3]), (1, 2, [1])],
)
def test_nodes_must_divide_dp(dp: int, nodes: int, allowed: list[int]) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**BASE, "dp": dp, "nodes": nodes})
    assert info.value.field == "nodes"
    assert info.value.allowed == allowed
    assert str(info.value).startswith("nodes: ") and f"allowed: {', '.join(map(str, allowed))}" in str(info.value)


@pytest.mark.parametrize("value", ["2", 2.0, True, None, [2]])
def test_nodes_must_be_an_integer(value: object) -> None:
    with pytest.raises(SpecError) as info:
        RunSpec.from_dict({**BASE, "nodes": value})
    assert info.value.field == "nodes" and "must be an integer" in str(info.value)
    assert info.value.allowed == [1, 2]


def test_allowed_nodes_are_the_divisors_of_dp() -> None:
    assert allowed_nodes(1) == [1]
    assert allowed_nodes(6) == [1, 2, 3, 6]
    assert allowed_nodes(8) == [1, 2, 4, 8]


def _rank_doc(rank: int, node: str | None) -> dict:
    doc = dict(phase_document(BASE, "train_and_save", rank, status="ok"))
    if node is not None:
        doc["node"] = node
    return doc


def test_merged_document_lists_every_ranks_node_by_rank() -> None:
    merged = merge_rank_documents([_rank_doc(1, "pnode2"), _rank_doc(0, "pnode1")])  # type: ignore[list-item]
    assert merged is not None and merged["rank"] == 0
    assert merged["node"] == "pnode1" and merged["rank_nodes"] == ["pnode1", "pnode2"]
    validate_phase_document(merged)
    # a rank without a document is a gap, not a shifted list
    gap = merge_rank_documents([_rank_doc(0, "pnode1"), _rank_doc(2, "pnode3")])  # type: ignore[list-item]
    assert gap is not None and gap["rank_nodes"] == ["pnode1", None, "pnode3"]


def test_documents_from_before_nodes_merge_and_validate_unchanged() -> None:
    merged = merge_rank_documents([_rank_doc(0, None), _rank_doc(1, None)])  # type: ignore[list-item]
    assert merged is not None and "rank_nodes" not in merged and "node" not in merged
    golden = Path(__file__).resolve().parents[1] / "golden"
    docs = sorted(golden.rglob("*.json"))
    assert docs, "no golden documents found"
    for path in docs:
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "phase" in doc and "steps" in doc:
            validate_phase_document(doc)


def test_one_node_jobs_keep_the_submitit_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    monkeypatch.setenv("MASTER_ADDR", "somehost")
    assert multinode.export_multinode_env() == {}
    assert multinode.job_nodes() == 1


def test_one_node_job_whose_hostname_does_not_resolve_rendezvous_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    monkeypatch.setenv("MASTER_ADDR", "pnode1.invalid")  # RFC 6761: never resolves
    assert multinode.export_multinode_env() == {}
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "localhost")  # a name that resolves is kept
    assert multinode.export_multinode_env() == {}
    assert os.environ["MASTER_ADDR"] == "localhost"


def test_gloo_interface_is_the_one_routing_to_the_master() -> None:
    assert multinode.route_source("127.0.0.1") == "127.0.0.1"
    assert multinode.interface_of("127.0.0.1") == "lo"
    assert multinode.interface_of("192.0.2.123") is None  # TEST-NET-1: on no interface here


def test_parity_submit_passes_nodes_only_when_given() -> None:
    import argparse

    from service.cli.client import submit

    parser = argparse.ArgumentParser()
    submit.register(parser.add_subparsers())
    base = ["submit", "--config", "moe-fp32-router", "--dp", "2"]
    assert "nodes" not in submit.build_body(parser.parse_args(base))["spec"]
    spec = submit.build_body(parser.parse_args([*base, "--nodes", "2"]))["spec"]
    assert spec["nodes"] == 2 and RunSpec.from_dict(spec).tasks_per_node == 1
