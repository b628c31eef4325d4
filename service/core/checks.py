"""Check identity and tracks: which runs are "the same check", and which history a run belongs to.

A *check* is the canonical run spec: every field of `RunSpec.to_dict()` (so a spec field added later
joins the identity without code here changing) and how its config trains (`RunSpec.training`: the
engine's training revision and every config field, so a config whose training changes starts a new
history rather than comparing a recipe-shaped run with a toy one), serialised with sorted keys and hashed. A *track*
is where a check's history accumulates: the run's `branch` label, else its environment's name.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from sqlalchemy import Connection, event, select

from jobs.spec import RunSpec
from models import Environment, Run

KEY_LENGTH = 16
DEFAULT_BASE_TRACK = "main"
# the label marking detector-health self-test runs (service/selftest/batch.py): they fail on purpose, so
# every default view leaves them out and the scheduler never starts them ahead of a user's run
SELFTEST_LABEL = "selftest"
# the labels of background work, which yields to user work (service/scheduler/submitter.py): detector-health
# self-tests, and the runs a track schedules on its source's new commits (service/tracks/schedule.py)
TRACK_LABEL = "track"
BACKGROUND_LABELS = (SELFTEST_LABEL, TRACK_LABEL)


def is_background(labels: dict[str, str] | None) -> bool:
    """Whether a run with these labels is background work (BACKGROUND_LABELS)."""
    return any(label in (labels or {}) for label in BACKGROUND_LABELS)
# always shown in the readable form, in this order; every other field only when it is not its default
HEADLINE = ("dp", "steps", "save_step")


def canonical(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as RunSpec normalises it (defaults filled in, workarounds sorted), or as stored if invalid."""
    try:
        return RunSpec.from_dict(spec).to_dict()
    except (ValueError, TypeError):
        # a row stored by an older build with a field since removed: its stored form is its identity
        return dict(spec)


def check_key(spec: dict[str, Any]) -> str:
    """The stable hash of a canonical spec and its training: sha256 over sorted-key compact JSON, 16 hex digits."""
    try:
        parsed = RunSpec.from_dict(spec)
    except (ValueError, TypeError):
        return _key(dict(spec))  # a row stored by an older build with a field since removed: as stored
    return spec_identity(parsed)[0]


def _key(data: dict[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def _value(value: Any) -> str:
    if isinstance(value, dict):  # a custom shape: key:value pairs, sorted
        return ",".join(f"{k}:{_value(v)}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value) or "-"
    return str(value)


def check_name(spec: dict[str, Any]) -> str:
    """The readable form: config, dp/steps/save_step, then every field that differs from its default."""
    return _name(canonical(spec))


def spec_identity(spec: RunSpec) -> tuple[str, str]:
    """The check key and readable name of a spec already parsed (a request's): no second parse."""
    data = spec.to_dict()
    return _key({**data, "training": spec.training}), _name(data)


def _name(data: dict[str, Any]) -> str:
    defaults = RunSpec.__dataclass_fields__
    parts = [str(data.get("config", "?"))]
    parts += [f"{k}={_value(data[k])}" for k in HEADLINE if k in data]
    for key in sorted(data):
        if key == "config" or key in HEADLINE:
            continue
        field = defaults.get(key)
        default = None if field is None else field.default
        if field is not None and _value(default) == _value(data[key]):
            continue
        parts.append(f"{key}={_value(data[key])}")
    return " ".join(parts)


def track_of(labels: dict[str, str] | None, environment_name: str) -> str:
    """The run's track: its `branch` label when given, else its environment's name."""
    branch = (labels or {}).get("branch", "").strip()
    return branch or environment_name


def track_regex(patterns: list[str]) -> str:
    """The patterns as one anchored regular expression (`*` any run of characters), for Python and Postgres."""
    return "^(" + "|".join(re.escape(p).replace(r"\*", ".*") for p in patterns) + ")$" if patterns else "^$"


def long_lived(track: str, environment: str, patterns: list[str]) -> bool:
    """Whether a track is long-lived (a matrix column): a branch the patterns name, or an environment's own
    track (runs with no branch label); else it is a pull request's."""
    return track == environment or re.match(track_regex(patterns), track) is not None


def base_track_of(labels: dict[str, str] | None) -> str:
    """The track a branch without history of its own is compared with (`base_branch` label, else main)."""
    return (labels or {}).get("base_branch", "").strip() or DEFAULT_BASE_TRACK


def identify(run: Run, environment_name: str, spec: RunSpec | None = None) -> None:
    """Stamp a run with its check key, readable check name and track (from spec when it is parsed already)."""
    key, name = spec_identity(spec) if spec is not None else (check_key(run.spec or {}), check_name(run.spec or {}))
    run.check_key, run.check_name = key, name[:500]
    run.track = track_of(run.labels, environment_name)[:200]


def install_identity_listener() -> None:
    """Give every inserted run its check identity (core/db.py calls this once, explicitly)."""
    if not event.contains(Run, "before_insert", _identify_on_insert):
        event.listen(Run, "before_insert", _identify_on_insert)


def _identify_on_insert(_mapper: Any, connection: Connection, run: Run) -> None:
    # every writer of runs (API, reruns, tests, seeds) gets an identity, not only create_run
    if run.check_key and run.check_name and run.track:
        return
    name = connection.scalar(select(Environment.name).where(Environment.id == run.environment_id)) or ""
    identify(run, name)
