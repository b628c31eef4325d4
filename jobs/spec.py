"""RunSpec: what a parity run trains, validated before anything is launched.

`to_dict()` is what the service stores and what each phase job receives; `from_dict()` is its
inverse and rejects unknown keys, so a typo in CI is an error rather than a silent default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from jobs import parallel_layout
from jobs.configs import CONFIGS, config_names
from jobs.contract import WORKAROUND_NAMES
from jobs.parallel_layout import ParallelLayout
from jobs.selftest.catalogue import mutant_names
from jobs.shape import SHAPE_FIELDS, ShapeError, apply_shape, shape_fields, validate_shape
from jobs.tolerance import DEFAULT_TOLERANCE, TOLERANCE_PROFILES

MAX_DP = 8
MAX_STEPS = 10_000
SHARDING_TYPES = (
    "dp_reshardable",
    "fully_reshardable",
    "dp_zero_gather_scatter",
    "fully_sharded_model_space",
)
DEFAULT_SHARDING = "dp_reshardable"
# the one format whose checkpoints load on another tensor, pipeline or expert parallel size (dp_reshardable
# keeps each DP layout's flat buffers; Megatron-Core: "fully reshardable" formats)
RESHARDABLE_ACROSS_MODEL_LAYOUTS = "fully_reshardable"
WORKAROUNDS = WORKAROUND_NAMES
TOLERANCES = tuple(TOLERANCE_PROFILES)
REQUIRED_KEYS = ("config", "dp", "steps", "save_step")
# "process": one job per attempt whose tasks fork a fresh child per phase (the default);
# "job": each phase is its own job (resume in another allocation, possibly another node).
ISOLATION_MODES = ("process", "job")
DEFAULT_ISOLATION = "process"
# resume under another DP layout (resume_dp)
# The global batch is lcm(dp, resume_dp) x the config's microbatches, each phase's ranks accumulating
# their share; more than this many microbatches per rank is a spec that costs far more than the check it
# buys (8: a production-recipe config's 2 per rank at 2 -> 3 or 3 -> 4)
MAX_MICROBATCHES_PER_RANK = 8
# The profile a resharded resume is judged by unless the spec names a non-exact one itself.
RESHARD_TOLERANCE = "reshard"
# multi-node (nodes)
# Ranks are spread evenly over `nodes` Slurm nodes (world size / nodes tasks per node).
DEFAULT_NODES = 1
# the device every rank runs on (device). "cpu": gloo and the CPU shims, CUDA hidden even on a GPU
# host; "cuda": one GPU per rank (LOCAL_RANK's), NCCL, deterministic settings, and the executor asks
# for a GPU per rank (jobs/protocol.py Payload.gpus_per_node). A config whose `requires` has "cuda"
# (a GPU check) is refused with device "cpu": it could never run there.
DEVICES = ("cpu", "cuda")
DEFAULT_DEVICE = "cpu"


def allowed_nodes(dp: int) -> list[int]:
    """The node counts a run of dp ranks can be spread over evenly (the divisors of dp)."""
    return [n for n in range(1, dp + 1) if dp % n == 0]


# Check identity.
# A check is the canonical stored spec: service/core/checks.py hashes to_dict(). These fields were in
# the first schema and are always stored. Every other field is stored only when it differs from its
# default, so a field added later, at a default meaning "as before", leaves every stored spec, check
# key (and with it all regression history) and golden document unchanged. tests/jobs/test_check_identity.py
# holds the rule: to add a field, give it such a default; nothing else is needed.
ALWAYS_STORED = ("config", "dp", "steps", "save_step", "sharding", "seed", "tolerance", "workarounds", "isolation")


def field_default(f: Any) -> Any:
    """A dataclass field's default value (calling its factory), or MISSING for a required field."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


class SpecError(ValueError):
    """A user error in a run spec; names the field and, where finite, the allowed values."""

    def __init__(self, field: str, message: str, allowed: list[Any] | None = None) -> None:
        self.field = field
        self.allowed = allowed
        self.message = message
        text = f"{field}: {message}"
        if allowed is not None:
            text += "; allowed: " + ", ".join(str(a) for a in allowed)
        super().__init__(text)


def _int(field: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise SpecError(field, f"{value} out of range {bound}")
    return value


def about(help: str, *, ge: int | None = None, le: int | None = None, lt: int | None = None,
          choices: Sequence[Any] | None = None, each: Sequence[str] | None = None,
          keys: Sequence[str] | None = None, suggested: Any = None, flag: str | None = None,
          hidden: bool = False) -> dict[str, Any]:
    """A RunSpec field's description (its dataclass metadata), the one source of the API's model
    (service/core/check_spec.py) and the client's options (service/cli/client/spec_args.py).

    help: one line; ge/le/lt: integer bounds; choices: a name field's allowed values; each: the allowed
    names of a list field; keys: the allowed keys of an object field; suggested: the client's value
    for a required field left off the command line; flag: the option's name where it is not the
    field's (a list field takes one name per flag); hidden: a field the client's help does not show.
    Bounds here are what a schema can say alone; the cross-field rules stay in __post_init__.
    """
    out: dict[str, Any] = {"help": help, "ge": ge, "le": le, "lt": lt, "suggested": suggested, "flag": flag,
                           "hidden": hidden}
    for name, values in (("choices", choices), ("each", each), ("keys", keys)):
        out[name] = tuple(values) if values is not None else None
    return out


@dataclass(frozen=True)
class RunSpec:
    """One parity check: train M steps saving at N, resume from N in fresh processes, compare.

    Every field carries its description (`about`): a field added here reaches the API's model and the
    client's options with nothing else to edit (tests/service/test_check_spec.py holds all three).
    """

    config: str = field(metadata=about("A named config (GET /api/v1/configs)", choices=config_names()))
    dp: int = field(metadata=about("Data-parallel ranks (at most the config's max_dp)", ge=1, le=MAX_DP,
                                   suggested=2))
    steps: int = field(metadata=about("Training steps M (more than the config's LR warmup)", ge=2, le=MAX_STEPS,
                                      suggested=20))
    save_step: int = field(metadata=about("The step N the checkpoint is saved at (N < M)", ge=1, lt=MAX_STEPS,
                                          suggested=10))
    sharding: str = field(default=DEFAULT_SHARDING, metadata=about(
        "Distributed-optimizer checkpoint format", choices=SHARDING_TYPES))
    seed: int = field(default=1234, metadata=about("The run's random seed", ge=0, le=2**63 - 1))
    tolerance: str = field(default=DEFAULT_TOLERANCE, metadata=about(
        "The tolerance profile the run is judged by", choices=TOLERANCES))
    workarounds: tuple[str, ...] = field(default=(), metadata=about(
        "Workarounds of known upstream bugs", each=WORKAROUNDS, flag="workaround"))
    # Injected resume bugs (jobs/selftest/catalogue.py): only the detector's self-test sets them.
    mutants: tuple[str, ...] = field(default=(), metadata=about(
        "Injected resume bugs (the detector's self-test)", each=mutant_names(), flag="mutant", hidden=True))
    isolation: str = field(default=DEFAULT_ISOLATION, metadata=about(
        "process: one job forks each phase; job: each phase its own job", choices=ISOLATION_MODES))
    # The resume phase runs with resume_dp ranks (None: dp, a resume at the same DP size).
    resume_dp: int | None = field(default=None, metadata=about(
        "Resume at another DP size (absent: dp; the same global batch); differs from dp", ge=1, le=MAX_DP))
    # Slurm nodes the ranks are spread over.
    nodes: int = field(default=DEFAULT_NODES, metadata=about("Slurm nodes the ranks are spread over; divides dp",
                                                             ge=1, le=MAX_DP))
    # Overrides of the preset's model shape (jobs/shape.py; {} = the preset).
    shape: dict[str, Any] = field(default_factory=dict, hash=False, metadata=about(
        "Overrides of the config's model shape", keys=tuple(SHAPE_FIELDS)))
    # Tensor, pipeline and expert parallel sizes beside dp, which stays the data-parallel size;
    # world size = dp * tp * pp (jobs/parallel_layout.py).
    tp: int = field(default=1, metadata=about("Tensor-parallel size", ge=1, le=parallel_layout.MAX_TP))
    pp: int = field(default=1, metadata=about("Pipeline-parallel size", ge=1,
                                              le=max(parallel_layout.SUPPORTED_PP)))
    ep: int = field(default=1, metadata=about("Expert-parallel size (MoE configs; divides dp)", ge=1,
                                              le=parallel_layout.MAX_EP))
    # Checkpoint I/O strategies, usable with any config: Megatron's async save path (async_sharded_save +
    # AsyncCallsQueue: training goes on while a forked writer writes step N) and the fully-parallel
    # save/load wrappers over the DP group.
    async_save: bool = field(default=False, metadata=about("Megatron's async checkpoint save"))
    fully_parallel: bool = field(default=False, metadata=about("The fully-parallel save/load wrappers"))
    # where the ranks run (DEVICES); not in ALWAYS_STORED: a cpu spec keeps its key, a cuda one is another check
    device: str = field(default=DEFAULT_DEVICE, metadata=about(
        "Where the ranks run: cpu, or cuda (one GPU per rank; a config that needs CUDA takes only cuda)",
        choices=DEVICES))
    # A resume on another model-parallel layout (None: the save's size): the resume phase runs its own job
    # with resume_dp (or dp) x resume_tp x resume_pp ranks and loads the fully_reshardable checkpoint there
    resume_tp: int | None = field(default=None, metadata=about(
        "Resume at another tensor-parallel size (absent: tp; fully_reshardable)", ge=1, le=parallel_layout.MAX_TP))
    resume_pp: int | None = field(default=None, metadata=about(
        "Resume at another pipeline-parallel size (absent: pp; fully_reshardable)", ge=1,
        le=max(parallel_layout.SUPPORTED_PP)))
    resume_ep: int | None = field(default=None, metadata=about(
        "Resume at another expert-parallel size (absent: ep; fully_reshardable)", ge=1, le=parallel_layout.MAX_EP))

    def __post_init__(self) -> None:
        # a list or an object where a name belongs must be a 422, not a TypeError in `in` (unhashable)
        for name in ("config", "sharding", "tolerance"):
            if not isinstance(getattr(self, name), str):
                raise SpecError(name, f"must be a string, got {type(getattr(self, name)).__name__}")
        if self.config not in CONFIGS:
            raise SpecError("config", f"unknown config {self.config!r}", config_names())
        max_dp = min(MAX_DP, CONFIGS[self.config].max_dp)
        _int("dp", self.dp, 1)
        if self.dp > max_dp:
            raise SpecError(
                "dp",
                f"{self.dp} exceeds the maximum {max_dp} for config {self.config!r}",
                list(range(1, max_dp + 1)),
            )
        _int("steps", self.steps, 2, MAX_STEPS)
        # Megatron's LR scheduler asserts warmup < decay steps (decay runs over the whole run)
        warmup = CONFIGS[self.config].lr_warmup_steps
        if self.steps <= warmup:
            raise SpecError("steps", f"{self.steps} must exceed config {self.config!r}'s {warmup} LR warmup steps; "
                            f"allowed: {warmup + 1}..{MAX_STEPS}")
        _int("save_step", self.save_step, 1)
        if self.save_step >= self.steps:
            raise SpecError("save_step", f"must be < steps ({self.steps}), got {self.save_step}")
        if self.sharding not in SHARDING_TYPES:
            raise SpecError("sharding", f"unknown sharding type {self.sharding!r}", list(SHARDING_TYPES))
        _int("seed", self.seed, 0, 2**63 - 1)
        if self.tolerance not in TOLERANCE_PROFILES:
            raise SpecError("tolerance", f"unknown tolerance profile {self.tolerance!r}", list(TOLERANCES))
        if isinstance(self.workarounds, str) or not isinstance(self.workarounds, (tuple, list)):
            raise SpecError("workarounds", f"must be a list of names, got {self.workarounds!r}", list(WORKAROUNDS))
        for w in self.workarounds:
            if not isinstance(w, str) or w not in WORKAROUNDS:
                raise SpecError("workarounds", f"unknown workaround {w!r}", list(WORKAROUNDS))
        if isinstance(self.mutants, str) or not isinstance(self.mutants, (tuple, list)):
            raise SpecError("mutants", f"must be a list of names, got {self.mutants!r}", mutant_names())
        for m in self.mutants:
            if m not in mutant_names():
                raise SpecError("mutants", f"unknown mutant {m!r}", mutant_names())
        if self.isolation not in ISOLATION_MODES:
            raise SpecError("isolation", f"unknown isolation mode {self.isolation!r}", list(ISOLATION_MODES))
        self._check_nodes()
        self._check_resume_dp(max_dp)  # after nodes: the resume's ranks are spread over the same nodes
        # custom shape: validated against the preset, after the config is known
        try:
            object.__setattr__(self, "shape", validate_shape(CONFIGS[self.config], self.shape))
        except ShapeError as exc:
            raise SpecError(exc.field, exc.message, exc.allowed) from None
        # parallel layout: Megatron-Core's constraints on the model as shaped, before anything is launched
        parallel_layout.validate(
            apply_shape(CONFIGS[self.config], self.shape), self.dp, self.tp, self.pp, self.ep, SpecError
        )
        self._check_resume_layout()
        for name in ("async_save", "fully_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(name, f"must be true or false, got {getattr(self, name)!r}", [False, True])
        self._check_device()
        # Canonical order so equal specs compare (and are stored) equal.
        object.__setattr__(self, "workarounds", tuple(sorted(set(self.workarounds))))
        object.__setattr__(self, "mutants", tuple(sorted(set(self.mutants))))

    def _check_device(self) -> None:
        if not isinstance(self.device, str) or self.device not in DEVICES:
            raise SpecError("device", f"unknown device {self.device!r}", list(DEVICES))
        if self.device != "cuda" and "cuda" in CONFIGS[self.config].requires:
            raise SpecError("device", f"config {self.config!r} is a GPU check (requires cuda) and cannot run on "
                            f"{self.device!r}", ["cuda"])

    @property
    def gpus_per_task(self) -> int:
        """GPUs each rank asks the executor for: one on cuda, none on cpu."""
        return 1 if self.device == "cuda" else 0

    # multi-node
    def _check_nodes(self) -> None:
        allowed = allowed_nodes(self.dp)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int):
            raise SpecError("nodes", f"must be an integer, got {self.nodes!r}", allowed)
        if self.nodes not in allowed:
            raise SpecError(
                "nodes", f"{self.nodes} does not divide dp ({self.dp}): ranks are spread evenly over nodes", allowed
            )

    @property
    def tasks_per_node(self) -> int:
        """Return the ranks each node runs: world size (dp * tp * pp) / nodes."""
        return self.world_size // self.nodes

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """Build a spec from plain data, rejecting unknown and missing keys."""
        if not isinstance(data, dict):
            raise SpecError("spec", f"must be an object, got {type(data).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise SpecError("spec", f"unknown key(s) {', '.join(unknown)}", known)
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise SpecError(missing[0], "is required")
        values = dict(data)
        for key in ("workarounds", "mutants"):
            if key in values and isinstance(values[key], list):
                values[key] = tuple(values[key])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Return the spec as JSON-ready plain data: the stored form, and the check's identity.

        The rule (see ALWAYS_STORED): the original fields always; every other field only when it
        differs from its default.
        """
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ALWAYS_STORED and value == field_default(f):
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, dict) else value
        return out

    @property
    def world_size(self) -> int:
        """Return the number of ranks (tasks) the save (and an unresharded resume) needs."""
        return self.layout("train_and_save").world_size

    def layout(self, phase: str) -> ParallelLayout:
        """The data, tensor, pipeline and expert parallel sizes a phase runs with."""
        if phase != "resume":
            return ParallelLayout(self.dp, self.tp, self.pp, self.ep)
        return ParallelLayout(self.phase_dp(phase), self.tp if self.resume_tp is None else self.resume_tp,
                              self.pp if self.resume_pp is None else self.resume_pp,
                              self.ep if self.resume_ep is None else self.resume_ep)

    def phase_world_size(self, phase: str) -> int:
        """The ranks (tasks) a phase runs with (ParallelLayout.world_size, the one place that counts them)."""
        return self.layout(phase).world_size

    @property
    def reshards_model(self) -> bool:
        """Whether the resume runs on another tensor, pipeline or expert parallel size than the save."""
        return any(v is not None for v in (self.resume_tp, self.resume_pp, self.resume_ep))

    @property
    def layout_free_view(self) -> bool:
        """Whether the saved and restored state compare in the view keyed by checkpoint key and offset
        (jobs/rank/probes/layout_view.py): a reshard where a model-parallel size is above 1 on either side.
        A reshard of pure data parallelism keeps the view by parameter name (probes/global_state.py)."""
        return self.reshards and (self.reshards_model or (self.tp, self.pp, self.ep) != (1, 1, 1))

    @property
    def layout_change(self) -> str:
        """The reshard as the calibration names it: `2->1` (pure DP), else `dp1tp2->dp2` (each layout's
        sizes other than 1, DP always)."""
        if not self.layout_free_view:
            return f"{self.dp}->{self.phase_dp('resume')}"
        return f"{self.layout('train_and_save').name}->{self.layout('resume').name}"

    @property
    def resumed_steps(self) -> list[int]:
        """Return the steps the resume phase runs: N+1..M."""
        return list(range(self.save_step + 1, self.steps + 1))

    # resume under another DP layout (resume_dp)

    def _check_resume_dp(self, max_dp: int) -> None:
        if self.resume_dp is None:
            return
        _int("resume_dp", self.resume_dp, 1)
        if self.resume_dp > max_dp:
            raise SpecError(
                "resume_dp",
                f"{self.resume_dp} exceeds the maximum {max_dp} for config {self.config!r}",
                list(range(1, max_dp + 1)),
            )
        if self.resume_dp == self.dp:  # one spelling per check: the same layout is "absent"
            raise SpecError("resume_dp", f"equals dp ({self.dp}); omit it to resume at the same DP size")
        if self.resume_dp % self.nodes:
            raise SpecError(
                "resume_dp",
                f"{self.resume_dp} is not divisible by nodes ({self.nodes}): the resume's ranks are spread evenly",
                [k for k in range(1, max_dp + 1) if k % self.nodes == 0 and k != self.dp],
            )
        per_rank = self.global_microbatches // min(self.dp, self.resume_dp)
        if per_rank > MAX_MICROBATCHES_PER_RANK:
            raise SpecError(
                "resume_dp",
                f"dp {self.dp} -> {self.resume_dp} needs a global batch of {self.global_microbatches} microbatches "
                f"({per_rank} per rank at DP {min(self.dp, self.resume_dp)}), more than {MAX_MICROBATCHES_PER_RANK}",
            )
        if CONFIGS[self.config].dropout > 0:
            # Dropout draws from per-rank generators; another layout has other ranks, so no resume
            # could reproduce the masks and every resharded step would differ by construction.
            raise SpecError(
                "resume_dp",
                f"config {self.config!r} uses dropout, whose random streams are per rank and cannot be resharded",
                [n for n, c in CONFIGS.items() if c.dropout == 0],
            )

    @property
    def reshards(self) -> bool:
        """Whether the resume runs on another layout than the save (another DP, TP, PP or EP size)."""
        return self.resume_dp is not None or self.reshards_model

    def _check_resume_layout(self) -> None:
        """A resume on another layout: one Megatron-Core accepts, in a format that reshards it."""
        if not self.reshards:
            return
        if not self.reshards_model:  # another DP size beside model parallelism: the resume's layout must hold
            self._check_resumed_layout("resume_dp")
            return
        changed = [n for n in ("resume_tp", "resume_pp", "resume_ep") if getattr(self, n) is not None]
        for name in changed:
            bound = {"resume_tp": parallel_layout.MAX_TP, "resume_pp": max(parallel_layout.SUPPORTED_PP),
                     "resume_ep": parallel_layout.MAX_EP}[name]
            _int(name, getattr(self, name), 1, bound)
            if getattr(self, name) == getattr(self, name.removeprefix("resume_")):
                raise SpecError(name, f"equals {name.removeprefix('resume_')} ({getattr(self, name)}); omit it to "
                                "resume at the same size")
        field_name = changed[0]
        if self.sharding != RESHARDABLE_ACROSS_MODEL_LAYOUTS:
            raise SpecError(field_name, f"a resume on another tensor, pipeline or expert parallel size loads only a "
                            f"{RESHARDABLE_ACROSS_MODEL_LAYOUTS} checkpoint (sharding {self.sharding!r} keeps its DP "
                            f"layout's shards); set sharding to {RESHARDABLE_ACROSS_MODEL_LAYOUTS}",
                            [RESHARDABLE_ACROSS_MODEL_LAYOUTS])
        cfg = CONFIGS[self.config]
        if cfg.optimizer != "distributed-adam":
            raise SpecError(field_name, f"config {self.config!r} trains with {cfg.optimizer}, whose checkpoint keeps "
                            "one layout", [n for n, c in CONFIGS.items() if c.optimizer == "distributed-adam"])
        if cfg.dropout > 0:
            raise SpecError(field_name, f"config {self.config!r} uses dropout, whose random streams are per rank "
                            "and cannot be resharded", [n for n, c in CONFIGS.items() if c.dropout == 0])
        # A TP change may change the padded vocabulary (a multiple of make_vocab_size_divisible_by x TP), as
        # Megatron-LM allows with distributed checkpoints (check_checkpoint_args skips padded_vocab_size): the
        # load keeps the rows both sizes hold (allow_shape_mismatch), and the view compares those
        # (jobs/rank/probes/layout_view.py, vocab_rows).
        self._check_resumed_layout(field_name)

    def _check_resumed_layout(self, field_name: str) -> None:
        cfg = CONFIGS[self.config]
        resumed = self.layout("resume")
        try:  # the resume's layout, by the same rules as the save's (named by the resume's own fields)
            parallel_layout.validate(apply_shape(cfg, self.shape), resumed.dp, resumed.tp, resumed.pp, resumed.ep,
                                     SpecError)
        except SpecError as exc:
            named = f"resume_{exc.field}" if exc.field in ("tp", "pp", "ep", "dp") else exc.field
            if getattr(self, named, None) is None:  # a size the resume keeps: the field that changed is at fault
                named = field_name
            raise SpecError(named, f"the resume's layout ({resumed.name}): {exc.message}", exc.allowed) from None

    @property
    def shared_vocab_rows(self) -> int:
        """The rows of the padded vocabulary that both the save's and the resume's TP size hold: what a load across
        a padding change restores (Megatron-Core's allow_shape_mismatch drops the other rows or fills them with
        zeros), and what the layout-free view compares."""
        cfg = apply_shape(CONFIGS[self.config], self.shape)
        return min(cfg.padded_vocab_size(self.tp), cfg.padded_vocab_size(self.layout("resume").tp))

    @property
    def training(self) -> str:
        """How the run's model trains (its config as shaped): ModelConfig.training."""
        return apply_shape(CONFIGS[self.config], self.shape).training

    def virtual_pipeline_size(self, phase: str = "train_and_save") -> int | None:
        """Model chunks per pipeline stage in a phase (the config's virtual_pipeline at PP > 1), or None."""
        chunks = CONFIGS[self.config].virtual_pipeline
        return chunks if self.layout(phase).pp > 1 and chunks > 1 else None

    def phase_dp(self, phase: str) -> int:
        """The number of ranks (tasks) a phase runs with."""
        return self.resume_dp if phase == "resume" and self.resume_dp is not None else self.dp

    @property
    def global_microbatches(self) -> int:
        """Microbatches per step over all ranks: the same global batch at both DP sizes.

        A recipe-shaped config accumulates its own `microbatches` per rank at the smaller DP size.
        """
        return math.lcm(self.dp, self.resume_dp or self.dp) * CONFIGS[self.config].microbatches

    def microbatches(self, phase: str) -> int:
        """Microbatches each rank accumulates per step in a phase (1 unless the run reshards)."""
        return self.global_microbatches // self.phase_dp(phase)

    @property
    def effective_isolation(self) -> str:
        """How the phases are launched: a resume on another number of ranks gets its own job.

        Under "process" one job forks both phases in each of its tasks, so both run with the same
        number of ranks. Sizing that job to max(dp, resume_dp) and idling the extra ranks would need
        per-phase worlds, rank filtering and peer waits in every task; a job per phase gives each
        phase exactly its ranks, and the resume a fresh allocation as a real reshard has. A resume
        on another layout of as many ranks (TP 2 -> DP 2) forks like any other: each phase's fresh
        children initialise their own layout (jobs/rank/dist.py), and the resume needs no second
        job start. The result records the isolation that ran.
        """
        if self.reshards and self.phase_world_size("resume") != self.world_size:
            return "job"
        return self.isolation

    @property
    def effective_tolerance(self) -> str:
        """The tolerance profile the run is judged by: `reshard` for a resharded resume left at `exact`.

        Another DP size reduces gradients (and the grad norm) in another order, so an exact
        comparison would fail every resharded run.
        """
        return RESHARD_TOLERANCE if self.reshards and self.tolerance == "exact" else self.tolerance



def allowed_values() -> dict[str, Any]:
    """Return the allowed values of every enumerated field, for forms and help text."""
    return {
        "config": config_names(),
        "dp": {"min": 1, "max": MAX_DP, "per_config": {n: min(MAX_DP, c.max_dp) for n, c in CONFIGS.items()}},
        "sharding": list(SHARDING_TYPES),
        "tolerance": list(TOLERANCES),
        "workarounds": list(WORKAROUNDS),
        "isolation": list(ISOLATION_MODES),
        "resume_dp": {"min": 1, "max": MAX_DP, "default": "dp", "must_differ_from": "dp"},
        "steps": {"min": 2, "max": MAX_STEPS},
        "nodes": {"min": 1, "rule": "divides dp"},  # multi-node
        # checkpoint I/O strategies (Megatron's async save, fully-parallel save/load wrappers)
        "async_save": [False, True],
        "fully_parallel": [False, True],
        "device": {"values": list(DEVICES), "default": DEFAULT_DEVICE,
                   "gpu_checks": [n for n, c in CONFIGS.items() if "cuda" in c.requires]},
        "shape": shape_fields(),
        **parallel_layout.allowed(CONFIGS),
    }
