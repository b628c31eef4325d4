"""The regression signature names, defined once: what a parity run's findings are called.

Every module that names a signature imports it from here (tests/jobs/test_signature_names.py finds a
spelled-out one); what each means, its kind and its match rule are `jobs/verdict/signatures.py`. Stdlib
only: the base client install and a bare environment Python import it.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

SignatureId = Literal[
    "optimizer-index-misalignment",
    "optimizer-index-unexplained",
    "optimizer-state-mismatch",
    "adam-step-not-restored",
    "adam-step-unexplained",
    "lr-schedule-mismatch",
    "layerwise-metadata-mismatch",
    "loss-divergence-unexplained",
    "bucket-offset-unaligned",
    "checkpoint-format-unsupported",
    "optimizer-step-key-missing",
    "fp32-view-inplace-load",
    "checkpoint-save-crash",
    "checkpoint-load-crash",
    "build-import-crash",
    "model-weights-mismatch",
    "main-params-mismatch",
    "optimizer-moments-mismatch",
    "param-group-scalars-mismatch",
    "param-group-identity-collision",
    "scheduler-state-mismatch",
    "iteration-mismatch",
    "rng-state-mismatch",
    "loss-scaler-mismatch",
    "save-mutates-live-state",
    "final-state-mismatch",
    "unsupported-by-build",
    "probe-not-applicable",
]
SIGNATURE_IDS: tuple[SignatureId, ...] = get_args(SignatureId)

OPTIMIZER_INDEX_MISALIGNMENT: Final = "optimizer-index-misalignment"
OPTIMIZER_INDEX_UNEXPLAINED: Final = "optimizer-index-unexplained"
OPTIMIZER_STATE_MISMATCH: Final = "optimizer-state-mismatch"
ADAM_STEP_NOT_RESTORED: Final = "adam-step-not-restored"
ADAM_STEP_UNEXPLAINED: Final = "adam-step-unexplained"
LR_SCHEDULE_MISMATCH: Final = "lr-schedule-mismatch"
LAYERWISE_METADATA_MISMATCH: Final = "layerwise-metadata-mismatch"
LOSS_DIVERGENCE_UNEXPLAINED: Final = "loss-divergence-unexplained"
BUCKET_OFFSET_UNALIGNED: Final = "bucket-offset-unaligned"
CHECKPOINT_FORMAT_UNSUPPORTED: Final = "checkpoint-format-unsupported"
OPTIMIZER_STEP_KEY_MISSING: Final = "optimizer-step-key-missing"
FP32_VIEW_INPLACE_LOAD: Final = "fp32-view-inplace-load"
CHECKPOINT_SAVE_CRASH: Final = "checkpoint-save-crash"
CHECKPOINT_LOAD_CRASH: Final = "checkpoint-load-crash"
BUILD_IMPORT_CRASH: Final = "build-import-crash"
MODEL_WEIGHTS_MISMATCH: Final = "model-weights-mismatch"
MAIN_PARAMS_MISMATCH: Final = "main-params-mismatch"
OPTIMIZER_MOMENTS_MISMATCH: Final = "optimizer-moments-mismatch"
PARAM_GROUP_SCALARS_MISMATCH: Final = "param-group-scalars-mismatch"
PARAM_GROUP_IDENTITY_COLLISION: Final = "param-group-identity-collision"
SCHEDULER_STATE_MISMATCH: Final = "scheduler-state-mismatch"
ITERATION_MISMATCH: Final = "iteration-mismatch"
RNG_STATE_MISMATCH: Final = "rng-state-mismatch"
LOSS_SCALER_MISMATCH: Final = "loss-scaler-mismatch"
SAVE_MUTATES_LIVE_STATE: Final = "save-mutates-live-state"
FINAL_STATE_MISMATCH: Final = "final-state-mismatch"
UNSUPPORTED_BY_BUILD: Final = "unsupported-by-build"
PROBE_NOT_APPLICABLE: Final = "probe-not-applicable"
