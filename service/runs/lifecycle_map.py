"""The run lifecycle map in docs/lifecycle.md, generated from the state machine and the code that moves runs.

    .venv/bin/python -m service.runs.lifecycle_map --write docs/lifecycle.md

The states and moves come from `service/core/run_state.TRANSITIONS`; who moves a run into each state is read
from the source (every `transition(session, run, RunState.X, …)` call under service/); what entering a final
state runs is `service/runs/lifecycle.ON_FINISHED`. tests/service/test_lifecycle_map.py fails when the
document and the code disagree.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from jobs.surface_table import replace_table, table_in
from service.core.run_state import TERMINAL, TRANSITIONS, RunState
from service.runs.lifecycle import ON_FINISHED

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "lifecycle.md"
BEGIN, END = "<!-- lifecycle-map:begin -->", "<!-- lifecycle-map:end -->"


def movers() -> dict[str, set[str]]:
    """{state: the modules whose `transition(…)` calls move a run into it} (a target not written as
    `RunState.X` — a table lookup — is listed under `*`)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "transition"
                    and len(node.args) >= 3):
                continue
            target = node.args[2]
            state = target.attr.lower() if isinstance(target, ast.Attribute) else "*"
            out.setdefault(state, set()).add(str(path.relative_to(ROOT)))
    return out


def documented() -> str:
    """The map docs/lifecycle.md holds now (the text between its markers)."""
    return table_in(DOC.read_text(), (BEGIN, END))


def markdown() -> str:
    """The map: one row per state (where it may go, who moves runs into it, what entering it runs)."""
    moved_by = movers()
    handlers = ", ".join(f"`{h.__module__}.{h.__name__}`" for h in ON_FINISHED)
    lines = ["| state | may go to | moved here by | on entry |", "|---|---|---|---|"]
    for state in RunState:
        targets = ", ".join(f"`{t.value}`" for t in sorted(TRANSITIONS[state], key=list(RunState).index)) or "—"
        who = ", ".join(f"`{m}`" for m in sorted(moved_by.get(state.value, set()))) or "—"
        entry = handlers if state in TERMINAL else "—"
        lines.append(f"| `{state.value}` | {targets} | {who} | {entry} |")
    table_lookups = ", ".join(f"`{m}`" for m in sorted(moved_by.get("*", set())))
    if table_lookups:
        lines.append(f"\nMoves whose target is looked up in a table (a verdict's, a phase's): {table_lookups}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the lifecycle map, or write it into a document between its markers."""
    parser = argparse.ArgumentParser(prog="python -m service.runs.lifecycle_map", description=main.__doc__)
    parser.add_argument("--write", type=Path, help=f"the document to write it into ({DOC.name})")
    args = parser.parse_args(argv)
    if args.write:
        args.write.write_text(replace_table(args.write.read_text(), markdown(), (BEGIN, END)))
    else:
        print(markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
