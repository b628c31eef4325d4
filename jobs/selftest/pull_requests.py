"""Injected pull requests: realistic resume bugs, each a patch to a Megatron-LM main source tree.

A pull request is built from Megatron-LM main, so each entry here is a change applied to the
snapshot's source (`../shared/megatron-lm/`) before its wheel is built, exactly as a PR's CI builds
it: nothing is patched at run time and nothing edits an installed package. `parity selftest --prs`
(benchmarks/injected_prs.py) builds every one and runs the gate suite on it through the service;
each must fail the gate (exit 1) with its cause named, and clean main must pass (exit 0).

The changes span the files where resume bugs land: the DistributedOptimizer, the param buffer its
main params come from, dist_checkpointing and the LR scheduler. `causes` lists the signatures any
one of which names the fault (which check shows it depends on the layout); no test was written
for them first, and the acceptance corpus holds others.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from jobs.signature_names import (
    ADAM_STEP_NOT_RESTORED,
    ADAM_STEP_UNEXPLAINED,
    LR_SCHEDULE_MISMATCH,
    MAIN_PARAMS_MISMATCH,
    MODEL_WEIGHTS_MISMATCH,
    OPTIMIZER_INDEX_MISALIGNMENT,
    OPTIMIZER_INDEX_UNEXPLAINED,
    OPTIMIZER_MOMENTS_MISMATCH,
    PARAM_GROUP_SCALARS_MISMATCH,
    SCHEDULER_STATE_MISMATCH,
)

NAME = "megatron-lm-main-d98e8a6.tar.gz"


def _snapshot() -> Path:
    """PARITY_MEGATRON_SNAPSHOT, else the snapshot in ../shared/megatron-lm/ beside the checkout (or /work/shared)."""
    if os.environ.get("PARITY_MEGATRON_SNAPSHOT"):
        return Path(os.environ["PARITY_MEGATRON_SNAPSHOT"])
    candidates = [Path(__file__).resolve().parents[3] / "shared" / "megatron-lm" / NAME,
                  Path("/work/shared/megatron-lm") / NAME]
    return next((c for c in candidates if c.exists()), candidates[0])


SNAPSHOT = _snapshot()


@dataclass(frozen=True)
class PullRequest:
    """One injected change: replace `old` (which must occur once) by `new` in `path`."""

    name: str
    title: str
    path: str
    old: str
    new: str
    causes: tuple[str, ...]

    def apply(self, tree: Path) -> None:
        """Apply the change to a source tree; raise if the tree no longer has the line it changes."""
        target = tree / self.path
        text = target.read_text()
        if text.count(self.old) != 1:
            raise ValueError(f"{self.name}: {self.path} does not hold the changed lines exactly once")
        target.write_text(text.replace(self.old, self.new))


PULL_REQUESTS: tuple[PullRequest, ...] = (
    PullRequest(
        "index-map-global-position",
        "DistributedOptimizer: number params across all groups in the index map (while Bug A is still present)",
        "megatron/core/optimizer/distrib_optimizer.py",
        '                        local_param_group_map[param] = (group_index, len(group_range["params"]) - 1)\n',
        '                        local_param_group_map[param] = (\n'
        '                            group_index, sum(len(r["params"]) for r in group_ranges) - 1\n'
        '                        )\n',
        (OPTIMIZER_INDEX_UNEXPLAINED, OPTIMIZER_INDEX_MISALIGNMENT),
    ),
    PullRequest(
        "exp-avg-sq-not-restored",
        "DistributedOptimizer: skip the second moment when copying loaded optimizer state",
        "megatron/core/optimizer/distrib_optimizer.py",
        "            for key in dst_tensors:\n"
        "                if not isinstance(tensors[key], torch.Tensor):\n",
        "            for key in dst_tensors:\n"
        "                if key == 'exp_avg_sq':\n"
        "                    continue\n"
        "                if not isinstance(tensors[key], torch.Tensor):\n",
        (OPTIMIZER_MOMENTS_MISMATCH,),
    ),
    PullRequest(
        "main-params-from-param-buffer",
        "DistributedOptimizer: re-derive FP32 main params from the 16-bit param buffer after a load",
        "megatron/core/optimizer/distrib_optimizer.py",
        "            else:\n"
        "                raise NotImplementedError(f'Unknown sharding_type: {sharding_type}')\n"
        "\n"
        "    def _get_main_param_and_optimizer_states(self, model_param):\n",
        "            else:\n"
        "                raise NotImplementedError(f'Unknown sharding_type: {sharding_type}')\n"
        "            self._copy_model_params_to_main_params()\n"
        "\n"
        "    def _get_main_param_and_optimizer_states(self, model_param):\n",
        (MAIN_PARAMS_MISMATCH,),
    ),
    PullRequest(
        "adam-step-off-by-one",
        "DistributedOptimizer: restore the torch-Adam step as the checkpoint's minus one",
        "megatron/core/optimizer/distrib_optimizer.py",
        "            step = torch.tensor(steps[0], dtype=torch.float)\n",
        "            step = torch.tensor(steps[0] - 1, dtype=torch.float)\n",
        (ADAM_STEP_UNEXPLAINED, ADAM_STEP_NOT_RESTORED, PARAM_GROUP_SCALARS_MISMATCH),
    ),
    PullRequest(
        "lossy-checkpoint-load",
        "dist_checkpointing: hand loaded FP32 tensors back through bf16 to save host memory",
        "megatron/core/dist_checkpointing/serialization.py",
        "    merge(common_state_dict, loaded_state_dict)\n",
        "    from .dict_utils import dict_list_map_inplace\n"
        "\n"
        "    loaded_state_dict = dict_list_map_inplace(\n"
        "        lambda x: x.to(torch.bfloat16).to(torch.float32)\n"
        "        if isinstance(x, torch.Tensor) and x.dtype == torch.float32\n"
        "        else x,\n"
        "        loaded_state_dict,\n"
        "    )\n"
        "    merge(common_state_dict, loaded_state_dict)\n",
        (MAIN_PARAMS_MISMATCH, OPTIMIZER_MOMENTS_MISMATCH, MODEL_WEIGHTS_MISMATCH),
    ),
    PullRequest(
        "scheduler-off-by-one",
        "LR scheduler: restore one step fewer than saved",
        "megatron/core/optimizer_param_scheduler.py",
        "        self.step(increment=num_steps)\n",
        "        self.step(increment=max(0, num_steps - 1))\n",
        (SCHEDULER_STATE_MISMATCH, LR_SCHEDULE_MISMATCH),
    ),
)

BY_NAME = {pr.name: pr for pr in PULL_REQUESTS}


def source_tree(dest: Path, pull_request: PullRequest | None = None, snapshot: Path = SNAPSHOT) -> Path:
    """Unpack the main snapshot into dest (a buildable megatron-core tree) and apply a pull request."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(snapshot) as tar:
        tar.extractall(dest, filter="data")
    if pull_request is not None:
        pull_request.apply(dest)
    return dest
