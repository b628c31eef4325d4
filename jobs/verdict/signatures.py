"""Known failure signatures: what each means, whether it fails parity, and where it is tracked.

`kind` is "cause" when the signature explains a failed parity check, "latent" when a probe saw a
defect on a code path this run does not exercise (reported as an advisory; the verdict stands),
and "crash" for a phase that died (paired with a cause when one is known). `match` classifies a
phase error by stage, exception type and message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from jobs.contract import ErrorRecord, SignatureKind, Stage
from jobs.signature_names import (
    ADAM_STEP_NOT_RESTORED,
    ADAM_STEP_UNEXPLAINED,
    BUCKET_OFFSET_UNALIGNED,
    BUILD_IMPORT_CRASH,
    CHECKPOINT_FORMAT_UNSUPPORTED,
    CHECKPOINT_LOAD_CRASH,
    CHECKPOINT_SAVE_CRASH,
    FINAL_STATE_MISMATCH,
    FP32_VIEW_INPLACE_LOAD,
    ITERATION_MISMATCH,
    LAYERWISE_METADATA_MISMATCH,
    LOSS_DIVERGENCE_UNEXPLAINED,
    LOSS_SCALER_MISMATCH,
    LR_SCHEDULE_MISMATCH,
    MAIN_PARAMS_MISMATCH,
    MODEL_WEIGHTS_MISMATCH,
    OPTIMIZER_INDEX_MISALIGNMENT,
    OPTIMIZER_INDEX_UNEXPLAINED,
    OPTIMIZER_MOMENTS_MISMATCH,
    OPTIMIZER_STATE_MISMATCH,
    OPTIMIZER_STEP_KEY_MISSING,
    PARAM_GROUP_IDENTITY_COLLISION,
    PARAM_GROUP_SCALARS_MISMATCH,
    PROBE_NOT_APPLICABLE,
    RNG_STATE_MISMATCH,
    SAVE_MUTATES_LIVE_STATE,
    SCHEDULER_STATE_MISMATCH,
    UNSUPPORTED_BY_BUILD,
    SignatureId,
)

ISSUE_2777 = "https://github.com/NVIDIA/Megatron-LM/issues/2777"
PR_5835 = "https://github.com/NVIDIA/Megatron-LM/pull/5835"
PR_2872 = "https://github.com/NVIDIA/Megatron-LM/pull/2872"
DISTRIB_OPTIMIZER = "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/optimizer/distrib_optimizer.py"
OPTIMIZER_PY = "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/optimizer/optimizer.py"
PARAM_AND_GRAD_BUFFER = (
    "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/distributed/param_and_grad_buffer.py"
)
LAYER_WISE = "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/optimizer/layer_wise_optimizer.py"


ANY_STAGE: Literal["*"] = "*"


@dataclass(frozen=True)
class Signature:
    """One known signature."""

    name: SignatureId
    kind: SignatureKind
    title: str
    meaning: str
    references: tuple[str, ...] = ()
    match_stage: Stage | Literal["*"] | None = None
    match_type: str | None = None
    match_message: str | None = None

    def matches(self, error: ErrorRecord) -> bool:
        """Return True if a phase error record fits this signature's match rule."""
        if self.match_stage is None:
            return False
        if self.match_stage != ANY_STAGE and error.get("stage") != self.match_stage:
            return False
        if self.match_type and error.get("type") != self.match_type:
            return False
        text = f"{error.get('message', '')}\n{error.get('traceback', '')}"
        return not self.match_message or re.search(self.match_message, text) is not None

    def to_dict(self) -> dict[str, Any]:
        """Return the signature as plain data for the triage page."""
        return {
            "name": self.name,
            "kind": self.kind,
            "title": self.title,
            "meaning": self.meaning,
            "references": list(self.references),
        }


_TABLE = (
    Signature(
        OPTIMIZER_INDEX_MISALIGNMENT,
        "cause",
        "Optimizer index map points at other params' shards",
        "DistributedOptimizer.model_param_group_index_map is in grad-buffer order while the group "
        "is installed FP32-first; dp_reshardable save asserts, other formats raise size "
        "mismatches, equal shard sizes silently attach state to the wrong params (Bug A). A crash "
        "is attributed to it only by its own traceback (the dp_reshardable save assertion).",
        (ISSUE_2777, PR_5835, PR_2872),
        "save",
        "AssertionError",
        r"sharded_param_state_dp_reshardable",
    ),
    Signature(
        OPTIMIZER_INDEX_UNEXPLAINED,
        "cause",
        "Optimizer index map wrong where Bug A does not put it",
        "A DistributedOptimizer.model_param_group_index_map entry points at neither the param's own "
        "slot nor the slot Bug A predicts (its place in grad-buffer walk order within its group): a "
        "new index-map bug, which realign-param-index leaves as built and the known-failure entry of "
        "Bug A never matches. The evidence names each param, the slot it points at and its own.",
        (DISTRIB_OPTIMIZER,),
    ),
    Signature(
        OPTIMIZER_STATE_MISMATCH,
        "cause",
        "Checkpoint records other params' optimizer state",
        "What the checkpoint records for a param (read through the index map, as the save does) "
        "differs from the state the param owns at save (the silent case of Bug A).",
        (ISSUE_2777, PR_5835),
    ),
    Signature(
        ADAM_STEP_NOT_RESTORED,
        "cause",
        "Adam step not restored on load",
        "After a dp_reshardable load on the torch-Adam path (no TE/Apex) every Adam `step` is the "
        "dummy value from load priming instead of the checkpoint's N; the first resumed update "
        "(step N+1) uses the wrong bias correction, so losses differ from step N+2 on.",
        (DISTRIB_OPTIMIZER,),
    ),
    Signature(
        ADAM_STEP_UNEXPLAINED,
        "cause",
        "Adam step after load is neither the checkpoint's nor the priming value",
        "restore-adam-step corrects only what the torch-Adam load predicts (every `step` left at the "
        "value the load priming set); a step at any other value after the load is a new restore bug "
        "and is left as loaded, so the state diff fails the run.",
        (DISTRIB_OPTIMIZER,),
    ),
    Signature(
        LR_SCHEDULE_MISMATCH,
        "cause",
        "Learning rate differs after resume",
        "The resumed run applies a different learning rate than the uninterrupted run at some "
        "step: the scheduler state, or a param group's own LR bounds (decoupled_lr, a per-group override), "
        "was not restored as saved. Read from the step record's lr and from every param group's applied lr "
        "(`applied_lr`: the step and group where it first differs).",
        (),
    ),
    Signature(
        LAYERWISE_METADATA_MISMATCH,
        "cause",
        "Param-group metadata disagrees across ranks",
        "After load, ranks disagree on a param group's lr, weight decay or Adam step (Bug C: a "
        "LayerWiseDistributedOptimizer rank owning no params wrote broken common metadata; "
        "fixed in core_v0.16.0).",
        (LAYER_WISE,),
    ),
    Signature(
        MODEL_WEIGHTS_MISMATCH,
        "cause",
        "Model weights not restored",
        "Right after load, a weight or buffer as the model holds it differs (exact bytes) from the "
        "saved run's at step N. The resume is built from a different seed, so a weight the load "
        "skipped always shows.",
        (),
    ),
    Signature(
        MAIN_PARAMS_MISMATCH,
        "cause",
        "FP32 main params not restored",
        "Right after load, an optimizer main (FP32) param differs from the saved one, e.g. re-derived "
        "from the 16-bit model weights instead of loaded.",
        (DISTRIB_OPTIMIZER,),
    ),
    Signature(
        OPTIMIZER_MOMENTS_MISMATCH,
        "cause",
        "Optimizer moments not restored",
        "Right after load, an optimizer state tensor (exp_avg, exp_avg_sq, ...) differs from the saved one.",
        (DISTRIB_OPTIMIZER,),
    ),
    Signature(
        PARAM_GROUP_SCALARS_MISMATCH,
        "cause",
        "Param-group scalars not restored",
        "A param group's lr, weight decay, betas, eps or step differs from the saved run's, right "
        "after optimizer.load_state_dict (before the scheduler rewrites lr / wd) or after the load.",
        (),
    ),
    Signature(
        PARAM_GROUP_IDENTITY_COLLISION,
        "cause",
        "Param groups that differ in LR bounds load each other's settings",
        "The optimizer load matches saved param groups to the live ones by param_group_identifier_keys; "
        "up to megatron-core 0.16.x those keys (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr) "
        "leave out max_lr / min_lr, so groups that differ only there (decoupled_lr for the embedding and "
        "output layer, a per-group LR override) collide and one group's saved settings are loaded into "
        "both: the resumed run applies another group's LR schedule (fixed on Megatron-LM main, where "
        "the keys are ParamGroupOverride's fields).",
        (OPTIMIZER_PY,),
    ),
    Signature(
        SCHEDULER_STATE_MISMATCH,
        "cause",
        "LR scheduler state not restored",
        "The scheduler's state (num_steps, max/min lr, warm-up, decay) differs from the saved one.",
        (),
    ),
    Signature(
        ITERATION_MISMATCH,
        "cause",
        "Restored iteration is not N",
        "The iteration restored from the checkpoint differs from the step it was saved at; the "
        "resumed loop starts from the restored iteration, so steps are skipped or repeated.",
        (),
    ),
    Signature(
        RNG_STATE_MISMATCH,
        "cause",
        "RNG state not restored",
        "The torch CPU, CUDA or Megatron RNG-tracker state after load differs from the saved one; "
        "dropout then draws different masks.",
        (),
    ),
    Signature(
        LOSS_SCALER_MISMATCH,
        "cause",
        "fp16 loss scaler not restored",
        "The dynamic loss scaler's scale, growth or hysteresis tracker after load differs from the "
        "saved one: the resumed run scales, skips and grows the loss scale on another schedule.",
        (DISTRIB_OPTIMIZER,),
    ),
    Signature(
        SAVE_MUTATES_LIVE_STATE,
        "cause",
        "Saving changed the live run",
        "The state right after writing the checkpoint differs from the state right before it: the "
        "uninterrupted run is no longer the run that was saved.",
        (),
    ),
    Signature(
        FINAL_STATE_MISMATCH,
        "cause",
        "State after the last step differs",
        "The restored state matched the saved one, yet the state after step M differs between the "
        "runs: the resumed loop itself behaves differently.",
        (),
    ),
    Signature(
        LOSS_DIVERGENCE_UNEXPLAINED,
        "cause",
        "Loss diverged with no known cause",
        "The resumed loss, grad norm or num-zeros left the tolerance band but no probe found a cause.",
        (),
    ),
    Signature(
        BUCKET_OFFSET_UNALIGNED,
        "latent",
        "Bucket param offsets ignore 64-element padding",
        "_ParamAndGradBucket.param_to_index is cumulative numel without the distributed "
        "optimizer's 64-element start padding, so MXFP8 param all-gather copies wrong slices "
        "(Bug B; fixed in core_v0.17.0). Not on this run's path.",
        (PARAM_AND_GRAD_BUFFER,),
    ),
    Signature(
        PROBE_NOT_APPLICABLE,
        "latent",
        "A probe could not run on this build",
        "A probe read a Megatron-Core attribute this build lays out differently (compat.guarded): "
        "it reports 'not applicable on this build' with the reason, so its silence is not a clean bill.",
        (),
    ),
    Signature(
        CHECKPOINT_FORMAT_UNSUPPORTED,
        "cause",
        "Checkpoint format cannot be saved",
        "This build cannot write the requested optimizer sharding (0.16.1: "
        "fully_sharded_model_space raises 'flattened_range is not supported').",
        (DISTRIB_OPTIMIZER,),
        "save",
        None,
        r"flattened_range is not supported",
    ),
    Signature(
        OPTIMIZER_STEP_KEY_MISSING,
        "cause",
        "Checkpoint load misses Adam 'step'",
        "fully_reshardable / dp_zero_gather_scatter (and fully_sharded_model_space up to 0.15.x: "
        "sharded_param_state_fs_model_space skips 'step') save without the per-param Adam 'step' on "
        "the torch-Adam path (no TE / Apex FusedAdam), while _set_main_param_and_optimizer_states "
        "copies every key of the primed torch-Adam state, so the load raises KeyError: 'step'.",
        (DISTRIB_OPTIMIZER,),
        "load",
        "KeyError",
        r"'step'",
    ),
    Signature(
        FP32_VIEW_INPLACE_LOAD,
        "cause",
        "Load writes in place into FP32 leaf-param views",
        "FP32 params' optimizer shards are views of leaf params that require grad, so the "
        "dp_reshardable load's copy_ raises unless it runs under torch.no_grad() (second fix of "
        "PR #5835); hits every build with FP32 params in a DistributedOptimizer group.",
        (PR_5835,),
        "load",
        "RuntimeError",
        r"view of a leaf Variable that requires grad",
    ),
    Signature(
        UNSUPPORTED_BY_BUILD,
        "crash",
        "Option not supported by this build",
        "The build under test does not offer a requested option (e.g. a sharding type added in a "
        "later release: 0.13/0.14 raise 'Unknown sharding_type'). The check cannot run here; nothing "
        "is blamed on a known bug.",
        (),
        ANY_STAGE,
        None,
        r"Unknown sharding_type|UnsupportedByBuild|not supported by this build",
    ),
    Signature(
        CHECKPOINT_SAVE_CRASH,
        "crash",
        "Checkpoint save crashed",
        "The train_and_save phase raised while building or writing the step-N checkpoint.",
        (),
        "save",
    ),
    Signature(
        CHECKPOINT_LOAD_CRASH,
        "crash",
        "Checkpoint load crashed",
        "The resume phase raised while loading the step-N checkpoint.",
        (),
        "load",
    ),
    Signature(
        BUILD_IMPORT_CRASH,
        "crash",
        "The build does not import",
        "Importing megatron.core from the build under test raised (its environment's import check, or a phase "
        "that imported it): the build cannot train, so it cannot resume. The build's answer, not the service's.",
        (),
        "import",
        None,
        r"megatron",
    ),
)

SIGNATURES: dict[SignatureId, Signature] = {s.name: s for s in _TABLE}


def signature_table() -> list[dict[str, Any]]:
    """Return every known signature as plain data."""
    return [s.to_dict() for s in _TABLE]


def classify_error(error: ErrorRecord) -> list[SignatureId]:
    """Return the names of the signatures whose match rule fits a phase error record."""
    return [s.name for s in _TABLE if s.matches(error)]
