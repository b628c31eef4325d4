"""Which engine features a check exercises, read from the engine's own tables (pure; no torch).

A feature is a short name: `config:<name>`, `parallel:<dp|tp|pp|ep|dp-reshard>`, `sharding:<type>`,
`option:<spec flag>` (each boolean checkpoint option of RunSpec), `optimizer:<kind>`, `isolation:<mode>`
and `megatron:<setting>` (each Megatron-Core setting a config switches on). `engine_features()` lists
every one the engine knows, each with the reason it needs no CPU check (None: it needs one), so a suite
that claims to cover the engine (suites/gate.yaml; tests/jobs/test_gate_coverage.py) fails as soon as a
config, sharding type, layout field or option is added without a check for it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from jobs.configs import CONFIGS, OPTIMIZER_KINDS, ModelConfig
from jobs.parallel_layout import LAYOUT_FIELDS
from jobs.spec import ISOLATION_MODES, SHARDING_TYPES, RunSpec, field_default

RESHARD = "parallel:dp-reshard"
# Features no build the gate judges can run, with why (checked on Megatron-LM main and 0.16.1): a suite
# need not cover them, and the coverage table shows the reason instead of a check.
NO_CPU_CHECK = {
    "sharding:fully_sharded_model_space": "the DistributedOptimizer cannot save it on Megatron-LM main or 0.16.1: "
    "sharded_param_state_fs_model_space builds flattened_range ShardedTensors, which dist_checkpointing "
    "rejects ('ShardedTensor.flattened_range is not supported'); upstream marks the format for deprecation",
}
# Features a suite beside the gate runs, because the gate's 60 s budget has no room for them: the reason names it
BESIDE_THE_GATE = {
    "parallel:ep-reshard": "suites/layouts.yaml (reshard-ep2-to-ep4): EP 2 -> 1 (or 1 -> 2) is unsupported-by-build "
    "on Megatron-LM main and 0.16.1 (at EP 1 the experts are dense params, so the optimizer chain changes length, "
    "which ChainedOptimizer.load_state_dict cannot load), and an EP change above 1 needs four ranks",
}
# a resume whose tensor, pipeline or expert parallel size differs from the save's (fully_reshardable)
RESHARD_DIMENSIONS = tuple(f"parallel:{dim}-reshard" for dim in LAYOUT_FIELDS)


def option_fields() -> list[str]:
    """RunSpec's boolean options that default to off (async_save, fully_parallel, …): each is a feature."""
    return [f.name for f in fields(RunSpec) if field_default(f) is False]


def cpu_unsupported(cfg: ModelConfig) -> str | None:
    """Why a config cannot be checked on a CPU host (its `requires`), or None."""
    return f"a GPU check: needs {' and '.join(cfg.requires)}, absent on CPU" if cfg.requires else None


def config_features(cfg: ModelConfig) -> set[str]:
    """The config's own features: its name, its optimizer and each Megatron-Core setting it switches on."""
    return {f"config:{cfg.name}", f"optimizer:{cfg.optimizer}", *(f"megatron:{k}" for k in cfg.megatron_settings)}


def engine_features() -> dict[str, str | None]:
    """Every feature the engine knows -> None (a CPU check must exercise it) or why none can."""
    out: dict[str, str | None] = {}
    cpu_features = set().union(*(config_features(c) for c in CONFIGS.values() if cpu_unsupported(c) is None))
    for cfg in CONFIGS.values():
        for feature in config_features(cfg):
            # a setting some CPU config also switches on is a CPU feature, even if a GPU config has it too
            out.setdefault(feature, None if feature in cpu_features else cpu_unsupported(cfg))
    for kind in OPTIMIZER_KINDS:
        out.setdefault(f"optimizer:{kind}", None)
    for dim in ("dp", *LAYOUT_FIELDS):
        out[f"parallel:{dim}"] = None
    out[RESHARD] = None
    for feature in RESHARD_DIMENSIONS:
        out[feature] = NO_CPU_CHECK.get(feature) or BESIDE_THE_GATE.get(feature)
    for sharding in SHARDING_TYPES:
        out[f"sharding:{sharding}"] = NO_CPU_CHECK.get(f"sharding:{sharding}")
    for name in option_fields():
        out[f"option:{name}"] = None
    for mode in ISOLATION_MODES:
        out[f"isolation:{mode}"] = None
    return dict(sorted(out.items()))


def spec_features(spec: RunSpec) -> set[str]:
    """The features one check exercises."""
    out = config_features(CONFIGS[spec.config])
    out.add(f"sharding:{spec.sharding}")
    out.add(f"isolation:{spec.effective_isolation}")
    if spec.dp > 1 or (spec.resume_dp or 0) > 1:
        out.add("parallel:dp")
    out.update(f"parallel:{dim}" for dim in LAYOUT_FIELDS if getattr(spec, dim) > 1)
    if spec.reshards:
        out.add(RESHARD)
    saved, resumed = spec.layout("train_and_save"), spec.layout("resume")
    out.update(f"parallel:{dim}-reshard" for dim in LAYOUT_FIELDS if getattr(saved, dim) != getattr(resumed, dim))
    out.update(f"option:{name}" for name in option_fields() if getattr(spec, name))
    return out


def coverage(specs: dict[str, RunSpec]) -> dict[str, Any]:
    """{feature: {"checks": [names exercising it], "reason": why none must}} for every engine feature."""
    by_feature: dict[str, list[str]] = {}
    for name, spec in specs.items():
        for feature in spec_features(spec):
            by_feature.setdefault(feature, []).append(name)
    return {f: {"checks": sorted(by_feature.get(f, [])), "reason": reason} for f, reason in engine_features().items()}


def uncovered(specs: dict[str, RunSpec]) -> list[str]:
    """The features a CPU check must exercise that none of `specs` does."""
    return [f for f, row in coverage(specs).items() if not row["checks"] and row["reason"] is None]


def markdown(specs: dict[str, RunSpec]) -> str:
    """The feature -> checks table docs/detection.md carries (`python -m jobs.surface_table --write` writes it);
    the Megatron-Core settings are the surface table's rows."""
    lines = ["| feature | gate checks exercising it |", "|---|---|"]
    for feature, row in coverage(specs).items():
        kind, name = feature.split(":", 1)
        if kind == "megatron":
            continue
        where = ", ".join(f"`{c}`" for c in row["checks"]) or f"none: {row['reason']}"
        lines.append(f"| {kind} `{name}` | {where} |")
    return "\n".join(lines) + "\n"
