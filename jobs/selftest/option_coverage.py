"""For each Megatron-Core setting a production-recipe config switches on: the injected pull requests that break its
resume, or why no Megatron-Core change can break a resume through it alone (pure; no torch).

Issue 52 asks that every option the engine newly exercises has a pull request that breaks its resume and fails
its gate check alone. Where an option keeps no state across steps and writes nothing a load restores (it
changes a step's arithmetic alike in the uninterrupted and the resumed run), a pull request that breaks it
breaks both runs alike: that is a training regression, not a resume one, and the reason says so.
tests/jobs/test_option_coverage.py checks the table against the recipe configs (a setting a recipe config
switches on and this table does not know fails it), against the pull requests (each named one exists and its
gate check switches the setting on) and against the gate. Whether each PR fails its check alone is run by
`benchmarks/injected_prs.py --own-check` (docs/detection.md).
"""

from __future__ import annotations

from jobs.configs import CONFIGS
from jobs.selftest.pull_requests import BY_NAME

RECIPE_CONFIGS = ("gpt-recipe", "moe-recipe")

_NO_STATE = ("keeps nothing across steps and writes nothing a checkpoint holds: it changes each step alike in the "
             "uninterrupted and the resumed run, so a change that breaks it is a training regression both runs share")

# setting -> the pull requests (jobs/selftest/pull_requests.py) that break its resume, or a reason (a str)
OPTION_PULL_REQUESTS: dict[str, tuple[str, ...] | str] = {
    "activation_func": ("swiglu-halves-merged-in-reverse",),
    "gated_linear_unit": ("swiglu-halves-merged-in-reverse",),
    "bf16": ("main-params-from-param-buffer", "lossy-checkpoint-load"),
    "bucket_size": ("forced-param-sync-skips-first-bucket",),
    "overlap_grad_reduce": ("forced-param-sync-skips-first-bucket",),
    "overlap_param_gather": ("forced-param-sync-skips-first-bucket",),
    "chained_optim_avoid_prefix": ("chained-prefix-dropped-for-every-format",),
    "singleton_local_shards": ("chained-prefix-dropped-for-every-format",),
    "check_for_nan_in_grad": ("rerun-state-saved-as-will-rerun",),
    "rerun_mode": ("rerun-state-saved-as-will-rerun",),
    "decoupled_lr": ("param-groups-matched-without-lr-bounds",),
    "decoupled_min_lr": ("param-groups-matched-without-lr-bounds",),
    "lr_warmup_init": ("scheduler-warmup-init-key-mismatch",),
    "override_opt_param_scheduler": ("scheduler-override-restarts-steps",),
    "scheduler_by_samples": ("scheduler-override-restarts-steps", "scheduler-off-by-one"),
    "lr_decay_style": ("scheduler-wsd-anneal-start-saved-as-length",),
    "wsd_decay_steps": ("scheduler-wsd-anneal-start-saved-as-length",),
    "lr_wsd_decay_style": ("scheduler-wsd-anneal-start-saved-as-length",),
    "share_embeddings_and_output_weights": ("tied-output-copy-saved-as-primary",),
    "virtual_pipeline_model_parallel_size": ("vpp-chunk-layer-offset-ignores-vp-stage",),
    "num_moe_experts": ("moe-expert-replica-along-ep", "moe-expert-bias-local-counts"),
    "moe_token_dispatcher_type": ("moe-expert-replica-along-ep",),
    "moe_router_topk": ("router-token-counts-not-reset",),
    "moe_router_load_balancing_type": ("router-token-counts-not-reset",),
    "moe_router_score_function": ("router-expert-bias-not-persistent",),
    "moe_router_dtype": "the dtype the router computes its scores in: " + _NO_STATE + " (the routers' FP32 params "
    "are fp32_modules, Bug A's trigger, judged by the index-map probe)",
    "num_microbatches": "gradient accumulation: " + _NO_STATE + "; the buffer the microbatches accumulate into is "
    "zeroed by each step (grad-buffer-not-zeroed breaks that, in dp2-moe-fp32-router-gates, which trains 2 "
    "microbatches too)",
    "calculate_per_token_loss": "grads divided by the step's token count in finalize_model_grads: " + _NO_STATE,
    "grad_reduce_in_fp32": "the grads' reduction dtype: " + _NO_STATE + "; the bf16 grad buffers it makes are "
    "laid out, bucketed and sharded as the FP32 ones (the index-map and bucket probes read them)",
    "make_vocab_size_divisible_by": "Megatron-LM's padding rule, applied before the model is built: Megatron-Core "
    "holds the padded rows as ordinary embedding rows (no Megatron-Core code knows which rows pad), saved and "
    "restored with the embedding (tied-output-copy-saved-as-primary, the TP layers' PRs)",
}


def recipe_settings() -> set[str]:
    """The Megatron-Core settings the production-recipe configs switch on."""
    return set().union(*(CONFIGS[name].megatron_settings for name in RECIPE_CONFIGS))


def pull_requests_for(setting: str) -> tuple[str, ...]:
    """The pull requests that break a setting's resume (empty where the table gives a reason instead)."""
    entry = OPTION_PULL_REQUESTS[setting]
    return () if isinstance(entry, str) else entry


def markdown() -> str:
    """The setting -> pull requests (or reason) table docs/detection.md carries (`python -m jobs.surface_table
    --write docs/detection.md` writes it)."""
    lines = ["| setting (a recipe config's) | injected pull requests that break its resume (their gate check) |",
             "|---|---|"]
    for setting in sorted(OPTION_PULL_REQUESTS):
        names = pull_requests_for(setting)
        where = ", ".join(f"`{n}` ({BY_NAME[n].check or 'gate'})" for n in names) or \
            f"none: {OPTION_PULL_REQUESTS[setting]}"
        lines.append(f"| `{setting}` | {where} |")
    return "\n".join(lines) + "\n"
