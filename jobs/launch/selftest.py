"""The detector's self-test: run every catalogue mutant (and a clean control) and judge the verdicts.

A mutant counts as caught when the run reports the catalogue's verdict and signatures; a benign
change or the control must pass with no signature (anything else is a false alarm).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.launch.local import run_parity
from jobs.selftest.catalogue import BASE_SPEC, COMBINED, MUTANTS, Mutant, combined_mutant, judge
from jobs.spec import RunSpec

CONTROL = "control"


def run_one(mutant: Mutant | None, dp: int, folder: Path, executor: Any = None) -> dict[str, Any]:
    """Run one mutant (None: the control; a combined mutant: all of COMBINED) at `dp`; judge it."""
    if mutant is None:
        fields = {**BASE_SPEC, "dp": dp}
    elif mutant.kind == "combined":
        fields = {**BASE_SPEC, "dp": dp, "mutants": list(COMBINED)}
    else:
        fields = mutant.run_spec(dp)
    result = run_parity(RunSpec.from_dict(fields), folder, executor)
    row = judge(mutant, result)
    return {
        "mutant": CONTROL if mutant is None else mutant.name,
        "kind": "control" if mutant is None else mutant.kind,
        "dp": dp,
        "expect": [] if mutant is None else list(mutant.expect),
        **row,
    }


def run_selftest(
    run_folder: Path,
    dps: tuple[int, ...] = (2,),
    names: list[str] | None = None,
    fast: bool = False,
    executor: Any = None,
) -> dict[str, Any]:
    """Run the catalogue (or the fast combined subset) at each DP; return the matrix and totals."""
    chosen: list[Mutant | None] = [None]
    if fast:
        chosen += [combined_mutant(), MUTANTS["benign-reordered-state-dict"]]
    else:
        chosen += [MUTANTS[n] for n in (names or list(MUTANTS))]
    rows = []
    for dp in dps:
        for i, mutant in enumerate(chosen):
            rows.append(run_one(mutant, dp, Path(run_folder) / f"dp{dp}" / f"{i:02d}", executor))
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
    }


def format_matrix(report: dict[str, Any]) -> str:
    """Render the detection matrix: mutant, DP, outcome, verdict, signatures, first divergent step."""
    lines = [f"{'mutant':<34} {'dp':>2}  {'outcome':<11} {'verdict':<7} {'first div':>9}  signatures"]
    for r in report["rows"]:
        step = "-" if r["first_divergent_step"] is None else str(r["first_divergent_step"])
        name = r["mutant"] if len(r["mutant"]) <= 34 else r["mutant"][:31] + "..."
        lines.append(
            f"{name:<34} {r['dp']:>2}  {r['outcome']:<11} {str(r['verdict']):<7} {step:>9}  "
            f"{', '.join(r['signatures']) or '-'}"
        )
    n = report["mutants"]
    pct = 100.0 * report["caught"] / n if n else 100.0
    lines.append("")
    lines.append(f"caught {report['caught']}/{n} ({pct:.0f} %), false alarms {report['false_alarms']}")
    return "\n".join(lines)
