"""Capture real documents of resumes that lose a tensor, one per way of losing it:
`python -m tests.golden.capture_causes [--from-folder DIR]` (DIR/<case>/ holds earlier run-local folders).

Each case is a self-test mutant injected at run time into Megatron-Core (jobs/rank/mutants.py), DP 1:
`skipped` (model-weight-skipped: the load puts the fresh build's embedding back), `wrong`
(exp-avg-sq-lossy-on-load: every exp_avg_sq passes through bf16 after the load) and `absent`
(expert-bias-not-checkpointed: the routers' expert_bias is left out of the checkpoint), and `mixed`
(main-params-from-model: most items loaded wrong, a few equal to the fresh build's by chance). What is
checked in is each phase's merged document, gzipped (tests/golden/causes/<case>/<phase>.json.gz),
and the spec; tests/jobs/test_causes.py judges them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
from pathlib import Path

from jobs.contract import PHASE_NAMES
from jobs.launch.local import run_parity
from jobs.protocol import RunPlan
from jobs.selftest.catalogue import MUTANTS
from jobs.spec import RunSpec

HERE = Path(__file__).resolve().parent / "causes"
CASES = {
    "skipped": ("model-weight-skipped", None),
    "wrong": ("exp-avg-sq-lossy-on-load", None),
    "absent": ("expert-bias-not-checkpointed", "moe-aux-free"),
    # main params re-derived from the loaded bf16 weights: wrong, except norm weights still at init (1.0, 0.0)
    "mixed": ("main-params-from-model", "moe-fp32-router"),
}


def spec_of(case: str) -> RunSpec:
    """The spec a case runs under."""
    mutant, base = CASES[case]
    return RunSpec.from_dict(MUTANTS[mutant].run_spec(1, base))


def write_case(case: str, run_folder: Path) -> None:
    """Write one run folder's merged phase documents and its spec under tests/golden/causes/<case>/."""
    out = HERE / case
    out.mkdir(parents=True, exist_ok=True)
    spec = spec_of(case)
    plan = RunPlan.of(spec)
    for phase in PHASE_NAMES:
        doc, _ = plan.collect(plan.attempt_folder(run_folder, phase, 1), phase)
        if doc is not None:
            for key in ("node", "rank_nodes"):  # the capturing host is no part of the contract
                doc.pop(key, None)  # type: ignore[misc]
            (out / f"{phase}.json.gz").write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(),
                                                                 mtime=0))
    (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True) + "\n")


def main() -> None:
    """Run (or read) each case and write its documents."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-folder", type=Path)
    args = parser.parse_args()
    for case in CASES:
        if args.from_folder:
            write_case(case, args.from_folder / case)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run_parity(spec_of(case), Path(tmp))
            write_case(case, Path(tmp))


if __name__ == "__main__":
    main()
