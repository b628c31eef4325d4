"""The exact commands that reproduce a run: locally (`parity run-local`) and on Slurm (`parity submit`).

The options are derived from the spec itself, field by field (`spec_args`), so a field added to
`RunSpec` later appears in the command without anyone editing this module; `run-local` and `submit`
accept one option per field (tests/dashboard/test_reproduce.py parses the command back and compares).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

# list fields are given one item per repeated option, named in the singular
LIST_OPTIONS = {"workarounds": "workaround", "mutants": "mutant"}


def canonical(spec: dict[str, Any]) -> dict[str, Any]:
    """Every field of the spec, defaults included (the stored spec as is if it no longer validates)."""
    from jobs.spec import RunSpec, SpecError

    try:
        full = RunSpec.from_dict(dict(spec))
    except (SpecError, TypeError, ValueError):
        return dict(spec)
    out = {f: getattr(full, f) for f in full.__dataclass_fields__}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def spec_args(spec: dict[str, Any]) -> list[str]:
    """One option per spec field, every field explicitly (a default changing later cannot change the run)."""
    args: list[str] = []
    for key, value in canonical(spec).items():
        option = "--" + LIST_OPTIONS.get(key, key).replace("_", "-")
        if value is None or value == {} or value == []:
            continue  # unset optional field (resume_dp, shape, workarounds): the option's own default
        if isinstance(value, bool):  # a switch: named when on
            args += [option] if value else []
            continue
        if isinstance(value, list):
            for item in value:
                args += [option, str(item)]
        elif isinstance(value, dict):
            args += [option, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        else:
            args += [option, str(value)]
    return args


# labels the service sets on a suite's runs: a repro is not one of that suite run's checks
SUITE_LABELS = frozenset({"suite", "suite_run", "suite_check"})


def local_command(spec: dict[str, Any], *, environment: str | None = None, python: str | None = None,
                  url: str | None = None) -> str:
    """`parity run-local …` for this spec on the run's build: --environment NAME (resolved through the
    service at url) or --python PATH, shell-quoted."""
    where = ["--environment", environment] if environment else (["--python", python] if python else [])
    tail = ["--url", url] if url and environment else []
    return shlex.join(["parity", "run-local", *where, *spec_args(spec), *tail])


def submit_command(spec: dict[str, Any], *, environment: str, labels: dict[str, str], base_url: str,
                   repro_of: int | None = None) -> str:
    """`parity submit … --wait` against this service, shell-quoted (the token comes from PARITY_TOKEN): what the
    base client (no torch) runs; labelled `repro_of=<run>`, without the suite's own labels."""
    args = ["parity", "submit", *spec_args(spec), "--environment", environment]
    kept = {k: v for k, v in labels.items() if k not in SUITE_LABELS}
    if repro_of is not None:
        kept["repro_of"] = str(repro_of)
    for key, value in sorted(kept.items()):
        args += ["--label", f"{key}={value}"]
    args += ["--url", base_url, "--wait"]
    return shlex.join(args)
