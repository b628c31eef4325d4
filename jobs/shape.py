"""Custom shapes: a spec's `shape` overrides its preset's model shape within bounds that keep a check small.

Pure (no torch): the spec validates a shape up front with `validate_shape()`, the rank builds from
`apply_shape(preset, shape)`, and `shape_fields()` documents every field for the API and the CLI.
The named configs stay presets; a shape only changes what its keys name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jobs.configs import ModelConfig

# The module-name suffixes that `fp32_router` / `fp32_output_head` add to a config's fp32_modules.
ROUTER_MODULE = "mlp.router"
OUTPUT_HEAD_MODULE = "output_layer"
# An estimate of the parameter count above which a shape is refused: each phase must stay ~seconds on CPU.
MAX_PARAMS = 4_000_000


@dataclass(frozen=True)
class ShapeField:
    """One overridable field: its type, range and what it means."""

    name: str
    kind: str  # "int" or "bool"
    description: str
    lo: int = 0
    hi: int = 0
    moe_only: bool = False  # only on presets with experts (kind gpt, num_experts > 0)

    def doc(self, preset: ModelConfig | None = None) -> dict[str, Any]:
        """The field as plain data (range, type, description; the preset's value when given)."""
        out: dict[str, Any] = {"type": self.kind, "description": self.description}
        if self.kind == "int":
            out.update(min=self.lo, max=self.hi)
        else:
            out["allowed"] = [False, True]
        if self.moe_only:
            out["only_for"] = "gpt configs with experts (moe-*)"
        if preset is not None:
            out["preset"] = preset_value(preset, self.name)
        return out


SHAPE_FIELDS: dict[str, ShapeField] = {
    f.name: f
    for f in (
        ShapeField("num_layers", "int", "transformer layers", 1, 4),
        ShapeField("hidden_size", "int", "hidden size; divisible by num_attention_heads, even head dim", 16, 256),
        ShapeField("num_attention_heads", "int", "attention heads", 1, 8),
        ShapeField("num_experts", "int", "experts per MoE layer", 2, 16, moe_only=True),
        ShapeField("moe_router_topk", "int", "experts each token is routed to; <= num_experts", 1, 4, moe_only=True),
        ShapeField("ffn_hidden_size", "int", "MLP (and expert) FFN size; preset: 2 x hidden_size", 16, 1024),
        ShapeField("seq_length", "int", "tokens per sample", 8, 128),
        ShapeField("vocab_size", "int", "vocabulary size", 64, 4096),
        ShapeField("fp32_router", "bool", "keep the MoE routers in FP32", moe_only=True),
        ShapeField("fp32_gates", "bool", "add a learnable FP32 scalar gate to every MLP output"),
        ShapeField("fp32_output_head", "bool", "keep the output head (output_layer) in FP32, untied"),
    )
}


class ShapeError(ValueError):
    """A bad shape: `field` is `shape.<key>` (or `shape`), `allowed` the allowed values where finite."""

    def __init__(self, field: str, message: str, allowed: list[Any] | None = None) -> None:
        self.field, self.message, self.allowed = field, message, allowed
        super().__init__(f"{field}: {message}")


def preset_value(cfg: ModelConfig, name: str) -> Any:
    """The value a shape field has in a config (preset or already shaped)."""
    if name == "ffn_hidden_size":
        return cfg.ffn_hidden_size or 2 * cfg.hidden_size
    if name == "fp32_router":
        return ROUTER_MODULE in cfg.fp32_modules
    if name == "fp32_gates":
        return cfg.fp32_residual_gates
    if name == "fp32_output_head":
        return OUTPUT_HEAD_MODULE in cfg.fp32_modules
    return getattr(cfg, name)


def shape_fields(cfg: ModelConfig | None = None) -> dict[str, dict[str, Any]]:
    """Every field a shape may set on cfg (all fields when None), with its range and description."""
    if cfg is not None and cfg.kind != "gpt":
        return {}
    return {
        name: f.doc(cfg) for name, f in SHAPE_FIELDS.items()
        if cfg is None or not f.moe_only or cfg.num_experts
    }


def _check_value(f: ShapeField, value: Any) -> None:
    field = f"shape.{f.name}"
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise ShapeError(field, f"must be true or false, got {value!r}", [False, True])
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShapeError(field, f"must be an integer in {f.lo}..{f.hi}, got {value!r}")
    if not f.lo <= value <= f.hi:
        raise ShapeError(field, f"{value} out of range {f.lo}..{f.hi}")


def apply_shape(cfg: ModelConfig, shape: dict[str, Any]) -> ModelConfig:
    """The preset with the shape's overrides applied (shape assumed valid: see validate_shape)."""
    if not shape:
        return cfg
    changes: dict[str, Any] = {k: v for k, v in shape.items() if not k.startswith("fp32_")}
    fp32 = [m for m in cfg.fp32_modules if m not in (ROUTER_MODULE, OUTPUT_HEAD_MODULE)]
    if shape.get("fp32_router", ROUTER_MODULE in cfg.fp32_modules):
        fp32.append(ROUTER_MODULE)
    if shape.get("fp32_output_head", OUTPUT_HEAD_MODULE in cfg.fp32_modules):
        fp32.append(OUTPUT_HEAD_MODULE)
        # an FP32 head is a tensor of its own: tied, the output layer is the bf16 embedding's weight
        changes["tied_embeddings"] = False
    changes["fp32_modules"] = tuple(fp32)
    if "fp32_gates" in shape:
        changes["fp32_residual_gates"] = shape["fp32_gates"]
    return dataclasses.replace(cfg, **changes)


def estimated_params(cfg: ModelConfig) -> int:
    """A GPT config's parameter count, roughly (embedding, attention, MLP or experts, output head)."""
    h, ffn = cfg.hidden_size, cfg.ffn_hidden_size or 2 * cfg.hidden_size
    mlp = 2 * h * ffn * (cfg.num_experts or 1) + (h * cfg.num_experts if cfg.num_experts else 0)
    return 2 * cfg.vocab_size * h + cfg.num_layers * (4 * h * h + mlp)


def validate_shape(cfg: ModelConfig, shape: Any) -> dict[str, Any]:
    """Check a shape against its preset: keys, types, ranges, then the cross-field rules; return it sorted."""
    if not isinstance(shape, dict):
        raise ShapeError("shape", f"must be an object of field: value, got {type(shape).__name__}")
    if not shape:
        return {}
    if cfg.kind != "gpt":
        raise ShapeError("shape", f"config {cfg.name!r} (kind {cfg.kind}) takes no shape overrides; "
                         "shapes apply to the gpt configs")
    allowed = list(shape_fields(cfg))
    unknown = sorted(set(shape) - set(SHAPE_FIELDS))
    if unknown:
        raise ShapeError("shape", f"unknown key(s) {', '.join(map(str, unknown))}", allowed)
    for name in sorted(shape):
        f = SHAPE_FIELDS[name]
        if f.moe_only and not cfg.num_experts:
            raise ShapeError(f"shape.{name}", f"only for configs with experts; {cfg.name!r} is dense", allowed)
        _check_value(f, shape[name])
    def value(name: str) -> Any:
        return shape.get(name, preset_value(cfg, name))

    # cross-field rules before the dataclass is rebuilt (ModelConfig's own checks name no shape field)
    heads, hidden = value("num_attention_heads"), value("hidden_size")
    if hidden % heads or (hidden // heads) % 2:
        field = "shape.hidden_size" if "hidden_size" in shape else "shape.num_attention_heads"
        raise ShapeError(field, f"hidden_size {hidden} must be divisible by num_attention_heads {heads} "
                         "with an even head dim (rotary embeddings)")
    if cfg.num_experts and value("moe_router_topk") > value("num_experts"):
        field = "shape.moe_router_topk" if "moe_router_topk" in shape else "shape.num_experts"
        raise ShapeError(field, f"moe_router_topk {value('moe_router_topk')} exceeds num_experts "
                         f"{value('num_experts')}", list(range(1, value("num_experts") + 1)))
    shaped = apply_shape(cfg, shape)
    n = estimated_params(shaped)
    if n > MAX_PARAMS:
        raise ShapeError("shape", f"about {n:,} parameters; a check stays under {MAX_PARAMS:,} "
                         "(fewer layers, experts, hidden or FFN size)")
    return {k: shape[k] for k in sorted(shape)}
