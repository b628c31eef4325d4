"""A local Megatron-Core source directory made from the installed copy, optionally with a deliberate change."""

from __future__ import annotations

import importlib.metadata as md
import shutil
from pathlib import Path

# Off by one on resume: the LR scheduler restores one step fewer than it saved, so every resumed
# step uses the previous step's learning rate (the resume bug a build can introduce).
LR_OFF_BY_ONE = (
    "megatron/core/optimizer_param_scheduler.py",
    "        self.step(increment=num_steps)\n",
    "        self.step(increment=max(0, num_steps - 1))  # parity test: deliberate resume bug\n",
)
PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "megatron-core"
version = "{version}"
dependencies = ["torch", "numpy", "packaging"]

[tool.setuptools.packages.find]
include = ["megatron*"]

[tool.setuptools.package-data]
"*" = ["*.so", "*.cpp", "*.txt", "*.md"]
"""


def make_source(dest: Path, *, local_version: str, change: tuple[str, str, str] | None = None) -> Path:
    """Copy the installed megatron package to dest as a buildable source tree; apply `change` if given."""
    dist = md.distribution("megatron-core")
    site = Path(str(dist.locate_file("")))
    shutil.copytree(site / "megatron", dest / "megatron", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "pyproject.toml").write_text(PYPROJECT.format(version=f"{dist.version}+{local_version}"))
    if change is not None:
        rel, old, new = change
        path = dest / rel
        text = path.read_text()
        assert text.count(old) == 1, f"the change no longer applies to {rel}"
        path.write_text(text.replace(old, new))
    return dest


# Resume bug in the DistributedOptimizer: loading a checkpoint restores each parameter's master
# weight and first moment but resets its second moment (exp_avg_sq) to zero instead of the saved one.
EXP_AVG_SQ_NOT_RESTORED = (
    "megatron/core/optimizer/distrib_optimizer.py",
    "            for key in dst_tensors:\n                dst_tensors[key].copy_(tensors[key])\n",
    "            for key in dst_tensors:\n"
    "                if key == 'exp_avg_sq':  # parity test: deliberate resume bug\n"
    "                    dst_tensors[key].zero_()\n"
    "                else:\n"
    "                    dst_tensors[key].copy_(tensors[key])\n",
)
