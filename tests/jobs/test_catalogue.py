"""The mutant catalogue as data: labels, siblings, the one-mutant-per-run plan and the evidence judge."""

from __future__ import annotations

import pytest

from jobs.rank.mutants import REGISTRY
from jobs.selftest.catalogue import (
    BASES,
    COMBINED,
    LAYERS,
    MATRIX_BASES,
    MUTANTS,
    catalogue_runs,
    combined_mutant,
    health_specs,
    judge,
)
from jobs.spec import RunSpec


def test_every_mutant_says_what_it_patches_and_harness_ones_have_a_megatron_sibling() -> None:
    for m in MUTANTS.values():
        assert m.layer in LAYERS and m.patches, m.name
        assert m.name in REGISTRY
        if m.layer == "harness":
            sibling = MUTANTS[m.sibling]
            assert sibling.layer == "megatron-core" and sibling.expect == m.expect, m.name
    assert MUTANTS["iteration-one-behind"].layer == "harness"
    assert MUTANTS["common-state-iteration-stale"].layer == "megatron-core"


def test_faults_name_the_evidence_they_must_leave() -> None:
    faults = [m for m in MUTANTS.values() if not m.benign]
    # every state fault names its item; index-map-swap (a probe of the map itself) and the build's
    # missing option (an error) are judged by signature alone
    unnamed = {m.name for m in faults if not m.evidence}
    assert unnamed == {"index-map-swap", "build-lacks-sharding-type"}
    for m in faults:
        assert {sig for sig, _ in m.evidence} <= set(m.expect), m.name


def test_the_vacuous_benign_mutant_is_gone() -> None:
    benign = {m.name for m in MUTANTS.values() if m.benign}
    assert "benign-reordered-state-dict" not in benign
    assert {"benign-load-priming-noise", "benign-stale-grads-after-load"} <= benign


def test_catalogue_runs_every_mutant_alone_on_both_bases_at_dp_1_and_2() -> None:
    runs = catalogue_runs((1, 2))
    for name, m in MUTANTS.items():
        for dp in (1, 2):
            bases = {b for _, mm, b, d in runs if mm is m and d == dp}
            expected = set(m.bases) & set(MATRIX_BASES) or {m.bases[0]}
            assert bases == (expected if dp >= m.min_dp else set()), (name, dp, bases)
    # every general mutant runs on both matrix bases; the exceptions say why
    one_base = {n for n, m in MUTANTS.items() if set(m.bases) & set(MATRIX_BASES) != set(MATRIX_BASES)}
    general = {n for n in one_base if set(MUTANTS[n].bases) & set(MATRIX_BASES)}
    assert general == {"index-map-swap", "index-map-swap-beside-bug-a"}
    assert all(MUTANTS[n].note for n in general)
    # a control per base and DP, and every row is one mutant (never a bundle)
    controls = {(b, d) for _, m, b, d in runs if m is None}
    assert controls == {(b, d) for _, _, b, d in runs}
    for _, mutant, base, dp in runs:
        RunSpec.from_dict({**BASES[base], "dp": dp} if mutant is None else mutant.run_spec(dp, base))


def test_health_batch_is_the_whole_catalogue_plus_the_combined_smoke() -> None:
    batch = health_specs()
    names = [n for n, _ in batch]
    assert len(names) == len(set(names)) and names[-1] == "combined"
    assert all(len(spec.get("mutants", [])) <= 1 for n, spec in batch if n != "combined")
    for _, spec in batch:
        RunSpec.from_dict(spec)


RESULT = {
    "verdict": "fail",
    "signatures": ["model-weights-mismatch"],
    "first_divergent_step": 3,
    "evidence": {"model-weights-mismatch": {
        "names": ["module.embedding.word_embeddings.weight"],
        "lost": {"items": [{"section": "model", "name": "embedding.word_embeddings.weight",
                            "how": "skipped by the load"}]}}},
}


def test_judge_checks_the_evidence_names() -> None:
    m = MUTANTS["model-weight-skipped"]
    assert judge(m, RESULT)["outcome"] == "caught"
    wrong = {**RESULT, "evidence": {"model-weights-mismatch": {"names": ["module.output_layer.weight"]}}}
    row = judge(m, wrong)
    assert row["outcome"] == "wrong evidence" and not row["ok"]
    assert row["evidence_missing"][0] == "model-weights-mismatch ~ word_embeddings\\.weight$"
    # the right tensor lost the wrong way: the cause must say the load skipped it
    loaded = {"section": "model", "name": "embedding.word_embeddings.weight", "how": "loaded wrong"}
    named_wrongly = {"names": ["module.embedding.word_embeddings.weight"], "lost": {"items": [loaded]}}
    row = judge(m, {**RESULT, "evidence": {"model-weights-mismatch": named_wrongly}})
    assert row["evidence_missing"] == [
        "model-weights-mismatch ~ ^model embedding\\.word_embeddings\\.weight skipped by the load$"]
    # the expert-bias mutant must name a router's expert_bias, not any weight
    bias = MUTANTS["expert-bias-zeroed-on-load"]
    assert judge(bias, RESULT)["outcome"] == "wrong evidence"
    named = {"model-weights-mismatch": {"names": ["buffer:module.decoder.layers.0.mlp.router.expert_bias"]}}
    assert judge(bias, {**RESULT, "evidence": named})["outcome"] == "caught"
    # without evidence (the service's stored verdicts) the signature decides
    assert judge(m, {k: v for k, v in RESULT.items() if k != "evidence"})["outcome"] == "caught"


@pytest.mark.parametrize("name", ["benign-stale-grads-after-load", "benign-load-priming-noise"])
def test_benign_mutants_must_pass_silently(name: str) -> None:
    assert judge(MUTANTS[name], {"verdict": "pass", "signatures": []})["outcome"] == "silent"
    assert judge(MUTANTS[name], RESULT)["outcome"] == "false alarm"


def test_combined_is_only_a_smoke_test_of_catalogue_members() -> None:
    assert set(COMBINED) <= set(MUTANTS)
    assert set(combined_mutant().expect) == {s for n in COMBINED for s in MUTANTS[n].expect}
