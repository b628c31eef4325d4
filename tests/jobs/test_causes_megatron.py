"""End to end on real Megatron-Core: a resume that loses two tensors in two ways (one injected fault puts
the fresh build's embedding back after the load, another passes every exp_avg_sq through bf16) fails with
causes naming each tensor by its state-dict name, its section and how it was lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.launch.local import run_parity
from jobs.selftest.catalogue import MUTANTS
from jobs.spec import RunSpec
from jobs.verdict.causes import SKIPPED, WRONG

pytestmark = pytest.mark.megatron


def test_a_real_resume_names_what_it_lost(tmp_path: Path) -> None:
    spec = {**MUTANTS["model-weight-skipped"].run_spec(1), "mutants": ["model-weight-skipped",
                                                                        "exp-avg-sq-lossy-on-load"]}
    r = run_parity(RunSpec.from_dict(spec), tmp_path)
    assert r["verdict"] == "fail", r["errors"]
    lines = r["cause_lines"]
    assert lines["model-weights-mismatch"] == \
        f"model-weights-mismatch: model embedding.word_embeddings.weight {SKIPPED} (rank 0)"
    assert lines["optimizer-moments-mismatch"].startswith("optimizer-moments-mismatch: moments ")
    assert f"/exp_avg_sq {WRONG} (rank 0; +" in lines["optimizer-moments-mismatch"]
    # what the load asked for, by its checkpoint key: the stacked layer's key, not the module's name
    requested = r["probes"]["resume"]["checkpoint_contents"]["requested"][0]  # type: ignore[index]
    assert requested["module.decoder.layers.1.mlp.linear_fc1.weight"] == "decoder.layers.mlp.linear_fc1.weight"
