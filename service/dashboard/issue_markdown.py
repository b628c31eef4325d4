""""Copy as issue": a triage page summarised as Markdown for pasting into an issue tracker."""

from __future__ import annotations

from typing import Any

from service.dashboard.triage import packages
from service.links import run_url


def _changed(rows: list[Any]) -> list[Any]:
    return [r for r in rows if getattr(r, "changed", False) or (isinstance(r, dict) and r.get("changed"))]


def _cell(value: Any) -> str:
    return "—" if value is None else str(value).replace("|", "\\|")


def _get(row: Any, key: str) -> Any:
    return row[key] if isinstance(row, dict) else getattr(row, key)


def issue_markdown(ctx: dict[str, Any], base_url: str) -> str:
    """Check, track, build, signatures with upstream links, last good vs this run, repro commands, run link."""
    run, good = ctx["run"], ctx.get("good")
    build = packages(run).get("megatron-core") or "unknown"
    lines = [
        f"## Resume parity {run.verdict or run.state}: {run.check_name} on {run.track}",
        "",
        f"- Run: [#{run.id}]({run_url(base_url, run.id)}) · [triage]({run_url(base_url, run.id, 'triage')})",
        f"- Check: `{run.check_key}` ({run.check_name})",
        f"- Track: `{run.track}` · environment `{run.environment.name}` · Megatron-Core `{build}`",
    ]
    if run.regression:
        base = run.compared_track
        where = f"against {base}" if base and base != run.track else f"on {run.track}"
        lines.append(f"- Regression: {where}")
    if run.first_divergent_step is not None:
        lines.append(f"- First divergent step: {run.first_divergent_step}")
    lines += ["", "### Signatures", ""]
    for sig in ctx.get("signatures") or []:
        refs = " ".join(f"[{r.replace('https://github.com/', '')}]({r})" for r in sig["references"])
        lines.append(f"- `{sig['name']}`: {sig['title']}" + (f" — {refs}" if refs else ""))
    if not ctx.get("signatures"):
        lines.append(f"- none matched; error: {run.error_message or '—'}")
    lines += ["", "### Last good vs this run", ""]
    if good is None:
        lines.append("No passing run of this check on this track is on record.")
    else:
        lines.append(f"Last good: [#{good.id}]({run_url(base_url, good.id)})")
        kinds = ("package_diff", "spec_diff", "label_diff")
        changes = [(kind, r) for kind in kinds for r in _changed(ctx.get(kind) or [])]
        if changes:
            lines += ["", "| what | key | last good | this run |", "|---|---|---|---|"]
            lines += [f"| {kind.split('_')[0]} | `{_cell(_get(r, 'key'))}` | {_cell(_get(r, 'good'))} | "
                      f"{_cell(_get(r, 'this'))} |" for kind, r in changes]
        else:
            lines.append("No package, spec or label differs.")
    lines += ["", "### Reproduce", "", "```sh", ctx["local_command"], ctx["submit_command"], "```"]
    smallest = (run.summary or {}).get("shrink")
    if smallest and smallest.get("strictly_smaller"):  # recorded by `parity shrink RUN`
        lines += ["", f"Smallest reproduction (same verdict and signatures, {smallest['runs']} trial runs):",
                  "", "```sh", smallest["command"], "```"]
    return "\n".join(lines) + "\n"
