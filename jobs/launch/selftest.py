"""The detector's self-test: run the catalogue one mutant per run (and a clean control per base) and judge.

A mutant counts as caught when the run reports the catalogue's verdict and signatures and its
evidence names what the mutant broke; a benign change or a control must pass with no signature
(anything else is a false alarm). `combined` (several mutants in one run) is a smoke test only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jobs.launch.local import run_parity
from jobs.selftest.catalogue import (
    BASE_SPEC,
    BASES,
    COMBINED,
    MATRIX_BASES,
    MUTANTS,
    Mutant,
    catalogue_runs,
    combined_mutant,
    judge,
)
from jobs.spec import RunSpec

CONTROL = "control"


def run_one(
    mutant: Mutant | None, dp: int, folder: Path, executor: Any = None, base: str | None = None
) -> dict[str, Any]:
    """Run one mutant (None: the control; a combined mutant: all of COMBINED) at `dp` on `base`; judge it."""
    if mutant is None:
        fields = {**(BASES[base] if base else BASE_SPEC), "dp": dp}
    elif mutant.kind == "combined":
        fields = {**BASE_SPEC, "dp": dp, "mutants": list(COMBINED)}
    else:
        fields = mutant.run_spec(dp, base)
    t0 = time.perf_counter()
    result = run_parity(RunSpec.from_dict(fields), folder, executor)
    row = judge(mutant, result)
    return {
        "mutant": CONTROL if mutant is None else mutant.name,
        "kind": "control" if mutant is None else mutant.kind,
        "layer": "-" if mutant is None or mutant.kind == "combined" else mutant.layer,
        "base": fields["config"] if base is None else base,
        "dp": dp,
        "expect": [] if mutant is None else list(mutant.expect),
        "seconds": round(time.perf_counter() - t0, 1),
        **row,
    }


def run_selftest(
    run_folder: Path,
    dps: tuple[int, ...] = (2,),
    names: list[str] | None = None,
    fast: bool = False,
    executor: Any = None,
    bases: tuple[str, ...] = MATRIX_BASES,
) -> dict[str, Any]:
    """Run the catalogue one mutant per run on `bases` at each DP (or the fast combined smoke); return the matrix."""
    plan: list[tuple[Mutant | None, str | None, int]]
    if fast:
        smoke: list[Mutant | None] = [None, combined_mutant(), MUTANTS["benign-state-in-new-storage"]]
        plan = [(m, None, dp) for dp in dps for m in smoke]
    else:
        plan = [(m, base, dp) for _, m, base, dp in catalogue_runs(dps, bases, names)]
    rows = []
    t0 = time.perf_counter()
    seen: dict[int, int] = {}  # runs so far per DP: each DP's folders count from 00
    for mutant, base, dp in plan:
        i = seen[dp] = seen.get(dp, -1) + 1
        rows.append(run_one(mutant, dp, Path(run_folder) / f"dp{dp}" / f"{i:02d}", executor, base))
    faulty = [r for r in rows if r["kind"] not in ("control", "benign")]
    caught = sum(r["ok"] for r in faulty)
    false_alarms = sum(not r["ok"] for r in rows if r["kind"] in ("control", "benign"))
    return {
        "rows": rows,
        "mutants": len(faulty),
        "caught": caught,
        "missed": len(faulty) - caught,
        "false_alarms": false_alarms,
        "ok": caught == len(faulty) and false_alarms == 0,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def format_matrix(report: dict[str, Any]) -> str:
    """Render the detection matrix: mutant, layer, base, DP, outcome, verdict, evidence, first divergent step, time."""
    lines = [
        f"{'mutant':<30} {'layer':<13} {'base':<18} {'dp':>2}  {'outcome':<11} {'verdict':<7} {'div':>3} "
        f"{'s':>5}  signatures [evidence]"
    ]
    for r in report["rows"]:
        step = "-" if r["first_divergent_step"] is None else str(r["first_divergent_step"])
        name = r["mutant"] if len(r["mutant"]) <= 30 else r["mutant"][:27] + "..."
        ev = "; ".join(f"{', '.join(v[:2])}" for v in (r.get("evidence_names") or {}).values() if v)
        lines.append(
            f"{name:<30} {r.get('layer', '-'):<13} {r.get('base', '-'):<18} {r['dp']:>2}  {r['outcome']:<11} "
            f"{str(r['verdict']):<7} {step:>3} {r.get('seconds', 0):>5}  {', '.join(r['signatures']) or '-'}"
            + (f" [{ev}]" if ev else "")
        )
    n = report["mutants"]
    pct = 100.0 * report["caught"] / n if n else 100.0
    lines.append("")
    lines.append(
        f"caught {report['caught']}/{n} ({pct:.0f} %), false alarms {report['false_alarms']}, "
        f"{len(report['rows'])} runs in {report.get('seconds', 0)} s"
    )
    return "\n".join(lines)
