"""Capture the golden phase documents from a real DP 2 run: `python -m tests.golden.capture [--from-folder DIR]`.

Known-bad: moe-fp32-router with no workaround (Bug A: the dp_reshardable save asserts, the probes
find the misaligned index map). Known-good: the same with realign-param-index + restore-adam-step
(bit-identical resume). What is checked in is each phase's merged rank document (exactly what the
reconciler ingests) and the verdict the capture produced, so tests notice when either drifts.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from jobs.contract import PHASE_NAMES
from jobs.launch.local import run_parity
from jobs.protocol import RunPlan
from jobs.spec import RunSpec

HERE = Path(__file__).resolve().parent
BASE = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}
CASES = {"bad": [], "good": ["realign-param-index", "restore-adam-step"]}


def write_case(name: str, run_folder: Path) -> None:
    """Write the merged phase documents of one captured run folder, and its verdict, under tests/golden/<name>/."""
    out = HERE / name
    out.mkdir(exist_ok=True)
    spec = RunSpec.from_dict({**BASE, "workarounds": CASES[name]})
    for phase in PHASE_NAMES:
        plan = RunPlan.of(spec)
        doc, _ = plan.collect(plan.attempt_folder(run_folder, phase, 1), phase)
        if doc is not None:
            (out / f"{phase}.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    result = json.loads((run_folder / "result.json").read_text())
    keep = ("verdict", "signatures", "advisories", "worked_around", "first_divergent_step")
    expected = {k: result[k] for k in keep} | {"spec": spec.to_dict()}
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def main() -> None:
    """Run both cases (or reuse run folders from a previous capture) and write the golden files."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from-folder", type=Path, help="a folder holding bad/ and good/ run folders")
    args = parser.parse_args()
    root = args.from_folder or Path(tempfile.mkdtemp(prefix="parity-golden-"))
    for name, workarounds in CASES.items():
        if args.from_folder is None:
            run_parity(RunSpec.from_dict({**BASE, "workarounds": workarounds}), root / name)
        write_case(name, root / name)
        print(f"golden {name}: written from {root / name}")


if __name__ == "__main__":
    main()
