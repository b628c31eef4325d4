""""Copy as issue": a triage page summarised as Markdown for pasting into an issue tracker."""

from __future__ import annotations

import re
from typing import Any

from service.core.links import run_url
from service.core.verdicts import clip, reading
from service.web.dashboard.triage import packages


def _changed(rows: list[Any]) -> list[Any]:
    return [r for r in rows if getattr(r, "changed", False) or (isinstance(r, dict) and r.get("changed"))]


# an absolute path on the service host (or a file:// URL to one): an issue tracker gets its last part only
HOST_PATH = re.compile(r"(?<![\w.~:/])(?:file://)?/(?:[\w.@+-]+/)+([\w.@+-]+)")
CELL_CHARS = 80


def no_host_paths(text: str) -> str:
    """text with every absolute host path shortened to …/its-last-part."""
    return HOST_PATH.sub(lambda m: f"…/{m.group(1)}", text)


def _cell(value: Any) -> str:
    return "—" if value is None else clip(no_host_paths(str(value)), CELL_CHARS).replace("|", "\\|")


def _get(row: Any, key: str) -> Any:
    return row[key] if isinstance(row, dict) else getattr(row, key)


def issue_markdown(ctx: dict[str, Any], base_url: str) -> str:
    """Check, track, build, signatures with upstream links, last good vs this run, repro commands, run link;
    no host paths (an issue tracker is read elsewhere)."""
    run, good = ctx["run"], ctx.get("good")
    build = packages(run).get("megatron-core") or "unknown"
    read = reading(run)
    lines = [
        f"## Resume parity {read.label}: {run.check_name} on {run.track}",
        "",
        f"- Verdict: {read.line()}",
        f"- Run: [#{run.id}]({run_url(base_url, run.id)}) · [triage]({run_url(base_url, run.id, 'triage')})",
        f"- Check: `{run.check_key}` ({run.check_name})",
        f"- Track: `{run.track}` · environment `{run.environment.name}` · Megatron-Core `{build}`",
    ]
    lines += ["", "### Signatures", ""]
    for sig in ctx.get("signatures") or []:
        refs = " ".join(f"[{r.replace('https://github.com/', '')}]({r})" for r in sig["references"])
        lines.append(f"- `{sig['name']}`: {sig['title']}" + (f" — {refs}" if refs else ""))
        if sig.get("cause_line"):  # what the resume lost, as the verdict named it
            lines.append(f"  - `{sig['cause_line']}`")
    if not ctx.get("signatures"):
        lines.append(f"- none matched; error: {no_host_paths(clip(run.error_message or '—', 300))}")
    lines += ["", "### Last good vs this run", ""]
    if good is None:
        lines.append(f"This check has never passed on track `{run.track}`: there is no last good run.")
        context = ctx.get("context_good")
        if context is not None:
            lines.append(f"For context only: nearest passing run of {run.config} is "
                         f"[#{context.id}]({run_url(base_url, context.id)}) ({context.check_name} on "
                         f"`{context.track}`, environment `{context.environment.name}`).")
    else:
        lines.append(f"Last good on track `{ctx.get('compared_track') or run.track}`: "
                     f"[#{good.id}]({run_url(base_url, good.id)}) on environment `{good.environment.name}`")
        freeze = ctx.get("freeze_diff") or {}
        pip = [(c.key, c.good, c.this) for c in freeze.get("changed") or []]
        pip += [(p.split("==")[0], None, p.split("==")[1]) for p in freeze.get("added") or []]
        pip += [(p.split("==")[0], p.split("==")[1], None) for p in freeze.get("removed") or []]
        kinds = ("env_diff", "package_diff", "spec_diff", "label_diff")
        changes = [(kind, r) for kind in kinds for r in _changed(ctx.get(kind) or [])]
        if changes or pip:
            lines += ["", "| what | key | last good | this run |", "|---|---|---|---|"]
            lines += [f"| {kind.split('_')[0]} | `{_cell(_get(r, 'key'))}` | {_cell(_get(r, 'good'))} | "
                      f"{_cell(_get(r, 'this'))} |" for kind, r in changes]
            lines += [f"| pip | `{_cell(name)}` | {_cell(a)} | {_cell(b)} |" for name, a, b in pip]
        else:
            lines.append("No environment, package, spec or label differs.")
    # the service's own commands (through its URL), never the host's interpreter path
    lines += ["", "### Reproduce", "", "```sh", ctx["submit_command"], ctx["local_command"], "```"]
    smallest = (run.summary or {}).get("shrink")
    if smallest and smallest.get("strictly_smaller"):  # recorded by `parity shrink RUN`
        lines += ["", f"Smallest reproduction (same verdict and signatures, {smallest['runs']} trial runs):",
                  "", "```sh", smallest["command"], "```"]
    return "\n".join(lines) + "\n"
