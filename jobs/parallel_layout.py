"""Parallel layout rules (tp, pp, ep beside dp), checked before anything is launched; no torch.

Megatron-Core 0.16.1 (`parallel_state.initialize_model_parallel`) builds
world size = tp * pp * cp * dp (cp = 1 here) and, for the experts, expert-tensor size etp (default
tp) * ep * pp must divide the world size; the expert data-parallel group then has
world / (etp * ep * pp) = dp * tp / (etp * ep) ranks, i.e. dp / ep with etp = tp. So `ep` must
divide `dp`. `TransformerConfig` needs num_attention_heads % tp == 0 and num_layers % pp == 0,
`MoELayer` asserts num_moe_experts % ep == 0, and the vocab-parallel embedding and the column /
row-parallel linears split vocab_size, hidden_size and ffn_hidden_size evenly over tp. Each rule
below is that rule, reported as a SpecError naming the field and the allowed values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # jobs.configs lists each config's layouts through this module
    from jobs.configs import ModelConfig

LAYOUT_FIELDS = ("tp", "pp", "ep")
# The harness's CPU recipe runs every rank on one host with gloo; 4 ranks is what it fits.
MAX_WORLD_SIZE = 4
MAX_TP = MAX_WORLD_SIZE
MAX_EP = MAX_WORLD_SIZE
# Pipeline stages run Megatron's 1F1B schedule over gloo send/recv (jobs/rank/pipeline.py).
SUPPORTED_PP = (1, 2)
MAX_PP = MAX_WORLD_SIZE


def _tp_dims(cfg: ModelConfig) -> dict[str, int]:
    """The sizes tensor parallelism splits (names as the config / TransformerConfig call them)."""
    ffn = getattr(cfg, "ffn_hidden_size", None) or cfg.hidden_size * 2  # as jobs/rank/model.py builds it
    dims = {
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "ffn_hidden_size": ffn,
        "vocab_size": cfg.vocab_size,
    }
    if cfg.num_experts:
        dims["moe_ffn_hidden_size"] = ffn
    return dims


class ParallelLayout(NamedTuple):
    """A phase's data, tensor, pipeline and expert parallel sizes (world size = dp x tp x pp; ep within dp)."""

    dp: int
    tp: int
    pp: int
    ep: int

    @property
    def world_size(self) -> int:
        """The ranks this layout runs on."""
        return self.dp * self.tp * self.pp

    @property
    def name(self) -> str:
        """`dp2`, `dp1tp2`, `dp2pp2ep2`: DP always, every other size above 1."""
        return f"dp{self.dp}" + "".join(f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("ep", self.ep))
                                        if v > 1)


def tp_choices(cfg: ModelConfig) -> list[int]:
    """The tensor-parallel sizes a config can be split into (1 for a model without TP layers)."""
    if cfg.kind != "gpt" or cfg.mtp_num_layers:
        return [1]  # MTP: the harness verifies its head at tp = pp = 1 only (see pp_choices)
    return [t for t in range(1, MAX_TP + 1) if all(v % t == 0 for v in _tp_dims(cfg).values())]


def ep_choices(cfg: ModelConfig) -> list[int]:
    """The expert-parallel sizes a config allows (1 for a dense model)."""
    if not cfg.num_experts:
        return [1]
    return [e for e in range(1, MAX_EP + 1) if cfg.num_experts % e == 0]


def pp_choices(cfg: ModelConfig) -> list[int]:
    """The pipeline sizes that divide the config's layers (what Megatron would accept)."""
    if cfg.kind != "gpt" or (cfg.mtp_num_layers and cfg.tied_embeddings):
        # MTP on a last stage (PP > 1) with tied embeddings: Megatron-Core allocates that stage's output
        # weight and never uses it (the MTP stage's embedding copy is the shared weight), so overlapped grad
        # reduce asserts that it got no grad. DeepSeek-V3 unties them, as gpt-mtp does.
        return [1]
    # with a virtual pipeline every stage holds `virtual_pipeline` chunks of whole layers
    return [p for p in range(1, MAX_PP + 1) if cfg.num_layers % (p * (cfg.virtual_pipeline if p > 1 else 1)) == 0]


def _int(field: str, value: Any, hi: int, error: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(field, f"must be an integer, got {value!r}", list(range(1, hi + 1)))
    if not 1 <= value <= hi:
        raise error(field, f"{value} out of range 1..{hi}", list(range(1, hi + 1)))
    return value


def validate(cfg: ModelConfig, dp: int, tp: Any, pp: Any, ep: Any, error: Any) -> None:
    """Raise `error(field, message, allowed)` (a SpecError) for a layout Megatron-Core would refuse."""
    _int("tp", tp, MAX_TP, error)
    _int("pp", pp, MAX_PP, error)
    _int("ep", ep, MAX_EP, error)
    if tp not in tp_choices(cfg):
        if cfg.kind != "gpt":
            why = f"config {cfg.name!r} ({cfg.kind}) has no tensor-parallel layers"
        elif cfg.mtp_num_layers:
            why = f"config {cfg.name!r} has a multi-token-prediction head, verified at tp = pp = 1 only"
        else:
            bad = ", ".join(f"{k} {v}" for k, v in _tp_dims(cfg).items() if v % tp)
            why = f"{tp} does not divide {bad} of config {cfg.name!r}"
        raise error("tp", why, tp_choices(cfg))
    if pp not in pp_choices(cfg):
        why = (
            f"config {cfg.name!r} ({cfg.kind}) has no pipeline stages"
            if cfg.kind != "gpt"
            else f"config {cfg.name!r} has a multi-token-prediction head with tied embeddings, which Megatron-Core "
            "cannot train on a last pipeline stage with overlapped grad reduce (its output weight gets no grad); "
            "an untied MTP config (gpt-mtp) runs at pp 2"
            if cfg.mtp_num_layers
            else f"{pp} x {cfg.virtual_pipeline} virtual chunks does not divide num_layers {cfg.num_layers} of config "
            f"{cfg.name!r}" if cfg.virtual_pipeline > 1
            else f"{pp} does not divide num_layers {cfg.num_layers} of config {cfg.name!r}"
        )
        raise error("pp", why, pp_choices(cfg))
    if pp not in SUPPORTED_PP:
        raise error(
            "pp",
            f"pipeline parallelism ({pp}) is not yet supported by the harness (needs the pipelined "
            "schedule over gloo send/recv)",
            list(SUPPORTED_PP),
        )
    if ep > 1 and not cfg.num_experts:
        raise error("ep", f"expert parallelism needs a MoE config; {cfg.name!r} is dense", [1])
    if ep not in ep_choices(cfg):
        raise error("ep", f"{ep} does not divide num_experts {cfg.num_experts} of config {cfg.name!r}", ep_choices(cfg))
    if dp % ep:
        # expert data-parallel size = dp * tp / (etp * ep) with etp = tp (mcore 0.16 default)
        raise error(
            "ep",
            f"must divide dp ({dp}): the expert data-parallel group has dp * tp / (ep * etp) ranks, etp = tp",
            [e for e in ep_choices(cfg) if dp % e == 0],
        )
    combined = [name for name, size in (("tp", tp), ("pp", pp), ("ep", ep)) if size > 1]
    if len(combined) > 1:
        # each of tp, pp and ep is verified on CPU on its own (tests/jobs/test_layouts_megatron.py);
        # a combination is refused rather than run unproven
        raise error(
            combined[-1],
            f"combining {' and '.join(combined)} > 1 is not yet supported; set at most one of tp, pp, ep above 1",
            [1],
        )
    world = ParallelLayout(dp, tp, pp, ep).world_size
    if tp * pp > 1 and world > MAX_WORLD_SIZE:
        # dp alone keeps its own limit (MAX_DP); model-parallel layouts run on one CPU host here.
        raise error(
            "tp" if tp > 1 else "pp",
            f"world size dp * tp * pp = {dp} * {tp} * {pp} = {world} exceeds {MAX_WORLD_SIZE}",
            [t for t in tp_choices(cfg) if dp * t * pp <= MAX_WORLD_SIZE] if tp > 1 else [1],
        )


def config_layouts(cfg: ModelConfig) -> dict[str, list[int]]:
    """The tp / pp / ep sizes one config can run with (pp: those the harness supports)."""
    return {
        "tp": tp_choices(cfg),
        "pp": [p for p in pp_choices(cfg) if p in SUPPORTED_PP],
        "ep": ep_choices(cfg),
    }


def allowed(configs: dict[str, ModelConfig]) -> dict[str, Any]:
    """The allowed layout values, overall and per config, for help text and forms."""
    return {
        "tp": {"min": 1, "max": MAX_TP, "per_config": {n: tp_choices(c) for n, c in configs.items()}},
        "pp": {"min": 1, "max": max(SUPPORTED_PP), "supported": list(SUPPORTED_PP)},
        "ep": {
            "min": 1,
            "max": MAX_EP,
            "per_config": {n: ep_choices(c) for n, c in configs.items()},
            "rule": "ep must divide num_experts and dp (expert data-parallel size dp / ep); MoE configs only",
        },
        "combinations": "at most one of tp, pp, ep above 1",
        "world_size": {"max": MAX_WORLD_SIZE, "rule": "dp * tp * pp when tp or pp > 1"},
    }
