"""Findings in sentences: which tensors, which ranks, and how the fingerprints say they changed."""

from __future__ import annotations

from service.web.dashboard.findings import explain_crash, fingerprint_hows, how_changed, sentence


def fp(total: float, abs_total: float, numel: int = 4) -> dict:
    return {"sum": total, "abs_sum": abs_total, "numel": numel}


def test_how_a_tensor_changed() -> None:
    assert how_changed(fp(2.0, 3.0), fp(0.0, 0.0)) == "zeroed"
    assert how_changed(fp(2.0, 3.0), fp(2.002, 3.003)) == "scaled ×1.001"
    assert how_changed(fp(2.0, 3.0), fp(6.0, 7.0)) == "shifted by +1 per element"
    assert how_changed(fp(2.0, 3.0), fp(5.0, 9.0), {(5.0, 9.0): "b/exp_avg"}) == "swapped with b/exp_avg"


def test_sentence_names_tensors_ranks_and_how() -> None:
    rows = [{"rank": r, "param": "decoder.router.weight", "key": "exp_avg_sq", "before": fp(2.0, 2.0),
             "after": fp(0.0, 0.0)} for r in (0, 1)]
    evidence = {"count": 2, "ranks": [0, 1], "items": [
        {"rank": 0, "name": "decoder.router.weight/exp_avg_sq", "before": "a", "after": "b"},
        {"rank": 1, "name": "decoder.router.weight/exp_avg_sq", "before": "a", "after": "c"}]}
    text = sentence("Optimizer moments differ after load", evidence, fingerprint_hows(rows))
    assert text == ("Optimizer moments differ after load: 1 tensor on ranks 0, 1 (2 differences in all) — "
                    "decoder.router.weight/exp_avg_sq is zeroed.")
    # a rank given by an enclosing item (the index-map evidence) counts
    nested = {"misaligned_total": 1, "per_rank": [{"rank": 1, "misaligned": [{"param": "head.weight"}]}]}
    assert "on rank 1 — head.weight" in (sentence("Index", nested, {}) or "")


def test_the_known_bad_save_crash_is_explained() -> None:
    why = explain_crash("AssertionError: (torch.Size([512]), 0, 131072)")
    assert why and "[512]" in why and "131072" in why and "resume never ran" in why
    assert explain_crash("OSError: disk full") is None


def test_swaps_are_one_kind_with_one_example() -> None:
    rows = [{"rank": 0, "param": f"p{i}", "key": "exp_avg", "before": fp(float(i + 1), float(i + 1)),
             "after": fp(float((i + 1) % 6 + 1), float((i + 1) % 6 + 1))} for i in range(6)]
    evidence = {"misaligned_total": 6, "per_rank": [{"rank": 0, "misaligned": [{"param": f"p{i}"} for i in range(6)]}]}
    text = sentence("Index", evidence, fingerprint_hows(rows)) or ""
    assert text.count("swapped") == 1 and "and 2 more are swapped with another tensor's state" in text
    assert "(e.g. p0 holds p1/exp_avg's values)" in text and len(text) < 300
