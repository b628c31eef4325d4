"""Pure comparison: both sides of every detector, on synthetic phase documents (no Megatron)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.launch.local import format_step_table
from jobs.signature_names import SIGNATURE_IDS
from jobs.verdict.compare import evaluate
from jobs.verdict.signatures import SIGNATURES, classify_error, signature_table
from tests.plugins.synthetic_documents import LOSS, LR, SPEC, baseline, optimizer_state, resumed


def test_bit_identical_passes() -> None:
    r = evaluate(SPEC, baseline(), resumed())
    assert r["verdict"] == "pass" and r["signatures"] == []
    assert r["first_divergent_step"] is None and r["lanes"]["exact"]["pass"]
    assert [s["step"] for s in r["steps"] if s["resumed_phase"]] == [4, 5, 6]
    json.dumps(r)
    assert "verdict: pass" in format_step_table(r)


def test_tiny_loss_difference_exact_vs_tolerance_lane() -> None:
    loss = {**LOSS, **{5: LOSS[5] * (1 + 1e-7)}}
    exact = evaluate(SPEC, baseline(), resumed(loss=loss))
    assert exact["verdict"] == "fail" and exact["first_divergent_step"] == 5
    assert exact["signatures"] == ["loss-divergence-unexplained"]
    tol = evaluate({**SPEC, "tolerance": "default"}, baseline(), resumed(loss=loss))
    assert tol["verdict"] == "pass" and tol["first_divergent_step"] == 5
    assert tol["first_step_beyond_tolerance"] is None and not tol["lanes"]["exact"]["pass"]
    row = next(s for s in tol["steps"] if s["step"] == 5)
    assert (row["loss_abs_delta"] or 0) > 0 and 0 < (row["loss_rel_delta"] or 0) < 1e-5


def test_loose_profile_allows_one_bad_step_but_not_two() -> None:
    one = {**LOSS, **{5: LOSS[5] * 1.2}}
    assert evaluate({**SPEC, "tolerance": "loose"}, baseline(), resumed(loss=one))["verdict"] == "pass"
    two = {**one, **{6: LOSS[6] * 1.2}}
    r = evaluate({**SPEC, "tolerance": "loose"}, baseline(), resumed(loss=two))
    assert r["verdict"] == "fail" and r["lanes"]["tolerance"]["failing_steps"] == [5, 6]


def test_lr_mismatch_is_its_own_signature() -> None:
    lr = {**LR, **{4: 9e-4, 5: 7e-4}}
    r = evaluate(SPEC, baseline(), resumed(lr=lr))
    assert r["verdict"] == "fail" and "lr-schedule-mismatch" in r["signatures"]
    assert r["first_divergent_step"] == 4 and r["evidence"]["lr-schedule-mismatch"]["first_step"] == 4


def test_adam_step_not_restored_both_sides() -> None:
    loss = {**LOSS, **{5: LOSS[5] + 5e-4, 6: LOSS[6] + 5e-4}}
    bad = evaluate(SPEC, baseline(), resumed(step=1.0, loss=loss))
    assert bad["verdict"] == "fail" and bad["signatures"] == ["adam-step-not-restored"]
    assert bad["evidence"]["adam-step-not-restored"]["step"] == 4 and bad["first_divergent_step"] == 5
    # Restored state is compared exactly even under the loose profile: a load is a copy.
    assert evaluate({**SPEC, "tolerance": "loose"}, baseline(), resumed(step=1.0))["verdict"] == "fail"
    assert evaluate(SPEC, baseline(), resumed(step=3.0))["verdict"] == "pass"


def test_state_mismatch_from_slots_and_after_load() -> None:
    probes = {"fingerprints_at_save": {"owned": [optimizer_state()], "slots": [optimizer_state(avg=-1.0)]}}
    r = evaluate(SPEC, baseline(probes=probes), resumed())
    assert r["verdict"] == "fail" and r["signatures"] == ["optimizer-state-mismatch"]
    moved = {"fingerprints_after_load": {"owned": [optimizer_state(avg=9.0)]}}
    assert evaluate(SPEC, baseline(), resumed(probes=moved))["signatures"] == ["optimizer-state-mismatch"]


def _misaligned_probe(total: int) -> dict:
    entry = {
        "param": "w",
        "dtype": "bfloat16",
        "group": 0,
        "index": 0,
        "expected_index": 1,
        "expected_numel": 131072,
        "installed_numel": 512,
        "installed_param": "router",
    }
    return {
        "applicable": True,
        "misaligned_total": total,
        "per_rank": [
            {
                "applicable": True,
                "misaligned_total": total,
                "optimizers": [
                    {"optimizer": 0, "entries": 2, "misaligned_count": total, "misaligned": [entry] * total}
                ],
            }
        ],
    }


SAVE_ASSERT = {
    "type": "AssertionError",
    "message": "(torch.Size([512]), 0, 131072)",
    "stage": "save",
    "traceback": "File distrib_optimizer.py, in sharded_param_state_dp_reshardable\nAssertionError",
}


def test_save_crash_with_misalignment_is_fail_without_is_error() -> None:
    probes = {"index_map": _misaligned_probe(2)}
    crashed = baseline(probes=probes, status="error", error=SAVE_ASSERT)
    r = evaluate(SPEC, crashed, None)
    assert r["verdict"] == "fail"
    assert set(r["signatures"]) == {"checkpoint-save-crash", "optimizer-index-misalignment"}
    assert r["evidence"]["optimizer-index-misalignment"]["per_rank"][0]["misaligned"][0]["installed_numel"] == 512
    assert r["error"] and r["error"]["traceback"]
    # Attributed by its own traceback even without the probe; another save crash is not blamed on Bug A.
    by_pattern = evaluate(
        SPEC, baseline(probes={"index_map": _misaligned_probe(0)}, status="error", error=SAVE_ASSERT), None
    )
    assert by_pattern["verdict"] == "fail" and "optimizer-index-misalignment" in by_pattern["signatures"]
    other = {**SAVE_ASSERT, "type": "OSError", "message": "disk full", "traceback": "OSError: disk full"}
    clean = {"index_map": _misaligned_probe(0)}
    unexplained = evaluate(SPEC, baseline(probes=clean, status="error", error=other), None)
    assert unexplained["verdict"] == "error" and unexplained["signatures"] == ["checkpoint-save-crash"]


def test_worked_around_misalignment_does_not_fail() -> None:
    probes = {
        "index_map": _misaligned_probe(2),
        "index_map_effective": _misaligned_probe(0),
        "fingerprints_at_save": {"owned": [optimizer_state()], "slots": [optimizer_state()]},
    }
    r = evaluate(SPEC, baseline(probes=probes), resumed())
    assert r["verdict"] == "pass" and r["worked_around"] == ["optimizer-index-misalignment"]


def test_known_load_crashes_are_fail_unknown_are_error() -> None:
    key = {"type": "KeyError", "message": "'step'", "stage": "load", "traceback": "KeyError: 'step'"}
    r = evaluate(SPEC, baseline(), resumed(status="error", error=key))
    assert r["verdict"] == "fail" and "optimizer-step-key-missing" in r["signatures"]
    other = {"type": "OSError", "message": "disk full", "stage": "load", "traceback": ""}
    r = evaluate(SPEC, baseline(), resumed(status="error", error=other))
    assert r["verdict"] == "error" and r["signatures"] == ["checkpoint-load-crash"]
    assert classify_error(
        {
            "rank": 0,
            "type": "RuntimeError",
            "stage": "load",
            "traceback": "",
            "message": "a view of a leaf Variable that requires grad is being used",
        }
    ) == ["fp32-view-inplace-load", "checkpoint-load-crash"]


def test_missing_documents_and_bad_spec_are_errors() -> None:
    assert evaluate(SPEC, None, None)["verdict"] == "error"
    assert evaluate(SPEC, baseline(), None)["verdict"] == "error"
    assert evaluate({**SPEC, "save_step": 9}, baseline(), resumed())["verdict"] == "error"
    train_crash = {"type": "RuntimeError", "message": "boom", "stage": "step", "traceback": ""}
    assert evaluate(SPEC, baseline(status="error", error=train_crash), None)["verdict"] == "error"


def test_latent_bucket_finding_is_an_advisory() -> None:
    issue = {
        "param": "gate",
        "numel": 1,
        "expected": [64, 576],
        "param_to_index": [1, 513],
        "problems": ["x"],
    }
    probes = {
        "fingerprints_at_save": {"owned": [optimizer_state()], "slots": [optimizer_state()]},
        "buckets": {
            "applicable": True,
            "unaligned_total": 1,
            "per_rank": [{"buffers": [{"buffer": 1, "issues": [issue]}]}],
        },
    }
    r = evaluate(SPEC, baseline(probes=probes), resumed())
    assert r["verdict"] == "pass" and r["advisories"] == ["bucket-offset-unaligned"] and r["signatures"] == []
    assert any(f["probe"] == "bucket_offsets" and not f["ok"] for f in r["probe_findings"])


def test_signature_table_has_references() -> None:
    table = {s["name"]: s for s in signature_table()}
    for name in (
        "optimizer-index-misalignment",
        "optimizer-state-mismatch",
        "adam-step-not-restored",
        "lr-schedule-mismatch",
        "bucket-offset-unaligned",
        "checkpoint-save-crash",
        "checkpoint-load-crash",
    ):
        assert name in table and name in SIGNATURES
    assert "https://github.com/NVIDIA/Megatron-LM/issues/2777" in table["optimizer-index-misalignment"]["references"]


@pytest.mark.parametrize("phase", ["train_and_save", "resume"])
@pytest.mark.parametrize("probe", ["index_map", "buckets", "fingerprints", "param_groups"])
def test_a_required_probe_missing_is_an_error_naming_it(phase: str, probe: str) -> None:
    docs = {"train_and_save": baseline(), "resume": resumed()}
    key = next(k for k in docs[phase]["probes"] if k.startswith(probe))
    del docs[phase]["probes"][key]  # type: ignore[misc]
    r = evaluate(SPEC, docs["train_and_save"], docs["resume"])
    assert r["verdict"] == "error" and r["error"] is not None
    assert r["error"]["type"] == "MissingProbe" and f"probes.{key}" in r["error"]["message"]


def test_realign_requires_the_effective_index_map() -> None:
    spec = {**SPEC, "workarounds": ["realign-param-index"]}
    r = evaluate(spec, baseline(), resumed())
    assert r["verdict"] == "error" and "probes.index_map_effective" in r["error"]["message"]  # type: ignore[index]


def test_every_contract_signature_id_has_a_table_row() -> None:
    assert set(SIGNATURES) == set(SIGNATURE_IDS)


def test_an_option_the_build_lacks_is_unsupported_by_build_never_a_bug() -> None:
    unsupported = {
        "type": "UnsupportedByBuild", "stage": "build", "traceback": "",
        "message": "sharding 'dp_reshardable' is not supported by this build (megatron-core 0.14.0): its "
                   "DistributedOptimizer offers only dp_zero_gather_scatter, fully_sharded_model_space",
    }
    # the check runs in the build stage before any probe, so nothing else is on record
    r = evaluate(SPEC, baseline(probes={}, status="error", error=unsupported), None)
    assert r["verdict"] == "error"
    assert r["signatures"] == ["unsupported-by-build"]
    assert r["error"] is not None and "dp_zero_gather_scatter" in r["error"]["message"]


BUILD_TRACEBACK = (
    'Traceback (most recent call last):\n'
    '  File "/work/main/jobs/rank/context.py", line 130, in run\n    value = fn()\n'
    '  File "/srv/envs/pr-7/lib/python3.12/site-packages/megatron/core/dist_checkpointing/validation.py", '
    'line 420, in _validate_sharding_for_key\n    assert shard_access_cnt == 1\n'
    "AssertionError: invalid access pattern for optimizer.chained_1.bucket_idx_0.param\n"
)


@pytest.mark.parametrize("stage", ["save", "load"])
def test_a_checkpoint_stage_that_raised_inside_the_build_is_a_fail_naming_the_frame(stage: str) -> None:
    """The build's own checkpoint code raised: the PR broke the save or the resume. Judged fail, with a cause
    line naming the frame and the build's message (the key it could not write)."""
    crash = {"type": "AssertionError", "message": "invalid access pattern for optimizer.chained_1.bucket_idx_0.param",
             "stage": stage, "rank": 1, "traceback": BUILD_TRACEBACK}
    docs = (baseline(status="error", error=crash), None) if stage == "save" else (
        baseline(), resumed(status="error", error=crash))
    r = evaluate(SPEC, *docs)
    assert r["verdict"] == "fail" and r["signatures"] == [f"checkpoint-{stage}-crash"]
    line = r["cause_lines"][f"checkpoint-{stage}-crash"]
    assert "megatron/core/dist_checkpointing/validation.py:_validate_sharding_for_key" in line
    assert "optimizer.chained_1.bucket_idx_0.param" in line


def test_a_build_whose_megatron_core_does_not_import_fails_naming_it() -> None:
    """A phase that imports the build itself (outside a warm pool) and raised in megatron/core's own frames: the
    build's answer (it cannot train, so cannot resume), not the harness's "couldn't tell"."""
    traceback = (
        '  File "/work/main/jobs/rank/entry.py", line 171, in imports\n    import megatron.core\n'
        '  File "/srv/envs/pr/site-packages/megatron/core/__init__.py", line 3, in <module>\n'
        '    from megatron.core.parallel_state import helper\n'
        "ImportError: cannot import name 'helper' from 'megatron.core.parallel_state'\n")
    crash = {"type": "ImportError", "message": "cannot import name 'helper' from 'megatron.core.parallel_state'",
             "stage": "import", "rank": 0, "traceback": traceback}
    r = evaluate(SPEC, baseline(status="error", error=crash), None)
    assert r["verdict"] == "fail" and r["signatures"] == ["build-import-crash"]
    assert "megatron/core/__init__.py:<module>" in r["cause_lines"]["build-import-crash"]


def test_a_tensor_op_that_raised_on_what_the_build_handed_it_is_the_builds() -> None:
    """copy_ raised inside torch (through the CPU shim) on a slice the build cut wrong: the build's frame."""
    traceback = (
        '  File "/srv/envs/pr/site-packages/megatron/core/optimizer/distrib_optimizer.py", line 1225, in '
        '_set_main_param_and_optimizer_states\n    dst_tensors[key].copy_(tensors[key])\n'
        '  File "/work/main/jobs/rank/cpu_shim.py", line 50, in __torch_function__\n    return func(*args)\n'
        '  File "/srv/envs/pr/site-packages/torch/_tensor.py", line 9, in copy_\n'
        "RuntimeError: The size of tensor a (16512) must match the size of tensor b (256)\n")
    crash = {"type": "RuntimeError", "message": "The size of tensor a (16512) must match", "stage": "load",
             "rank": 0, "traceback": traceback}
    r = evaluate(SPEC, baseline(), resumed(status="error", error=crash))
    assert r["verdict"] == "fail"
    assert "distrib_optimizer.py:_set_main_param_and_optimizer_states" in r["cause_lines"]["checkpoint-load-crash"]


@pytest.mark.parametrize("change", [
    {"traceback": BUILD_TRACEBACK.replace("megatron/core/dist_checkpointing", "jobs/rank/probes")},  # the harness
    {"traceback": BUILD_TRACEBACK + '  File "/x/torch/distributed/distributed_c10d.py", line 9, in barrier\n'},
    {"type": "OSError", "message": "No space left on device"},  # the host, whichever frame raised it
    {"stage": "step"},  # not a checkpoint stage
    {"traceback": ""},  # nothing to attribute
])
def test_any_other_crash_stays_an_error(change: dict[str, Any]) -> None:
    crash = {"type": "AssertionError", "message": "boom", "stage": "save", "rank": 1, "traceback": BUILD_TRACEBACK,
             **change}
    r = evaluate(SPEC, baseline(status="error", error=crash), None)
    assert r["verdict"] == "error"
