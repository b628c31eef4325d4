"""PARITY_POOL: which environments keep warm workers, how many, of how many tasks, for how long.

    PARITY_POOL="env=megatron-0.16:size=2:tasks=2:idle=300; env=*:size=1:tasks=4"

Entries are separated by `;`, fields by `:`. `env` (required) is an environment's name, or `*` for
every environment without an entry of its own; `tasks` (required) is the world size the workers
serve (dp x tp x pp of a phase; a run of another size goes cold); `size` is the most workers kept
for that environment and size (default 1); `idle` the seconds a worker may wait for work before it
is stopped (default 300; the pool shrinks to zero); `hang` the seconds without a heartbeat after
which a worker is taken for dead or hung (default 30). Empty: no pool, every attempt is cold.
"""

from __future__ import annotations

from dataclasses import dataclass

FIELDS = ("env", "size", "tasks", "idle", "hang")
# field -> (lowest, highest) accepted
LIMITS = {"size": (1, 64), "tasks": (1, 1024), "idle": (0, 86_400), "hang": (3, 3600)}


@dataclass(frozen=True)
class PoolEntry:
    """One environment's pool (env "*" for any environment without an entry of its own)."""

    env: str
    tasks: int
    size: int = 1
    idle_s: float = 300.0
    hang_s: float = 30.0
    # started for a suite run's checks, with no PARITY_POOL entry (service/runs/pool_dispatch.suite_entry):
    # its workers are let go only for idleness, and serve no run outside a suite
    on_demand: bool = False


class PoolConfigError(ValueError):
    """A PARITY_POOL that does not parse; the message names the entry, the field and what is allowed."""


def _number(entry: str, field: str, raw: str) -> int:
    low, high = LIMITS[field]
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise PoolConfigError(f"PARITY_POOL entry {entry!r}: {field} must be a whole number from {low} to {high}, "
                              f"got {raw[:40]!r}")
    return value


def parse_pool(text: str) -> tuple[PoolEntry, ...]:
    """The entries of a PARITY_POOL value (empty tuple when blank); PoolConfigError when malformed."""
    entries: list[PoolEntry] = []
    for raw_entry in filter(None, (e.strip() for e in text.split(";"))):
        entry = raw_entry[:80]
        fields: dict[str, str] = {}
        for item in raw_entry.split(":"):
            key, sep, value = (p.strip() for p in item.partition("="))
            if not sep or key not in FIELDS:
                raise PoolConfigError(f"PARITY_POOL entry {entry!r}: {item.strip()[:40]!r} is not one of "
                                      f"{', '.join(f + '=' for f in FIELDS)}")
            if key in fields:
                raise PoolConfigError(f"PARITY_POOL entry {entry!r}: {key} given twice")
            fields[key] = value
        for required in ("env", "tasks"):
            if required not in fields:
                raise PoolConfigError(f"PARITY_POOL entry {entry!r}: {required}= is required "
                                      "(env=<environment name or *>, tasks=<world size>)")
        env = fields["env"]
        if not env or len(env) > 200 or any(ord(c) < 32 for c in env):
            raise PoolConfigError(f"PARITY_POOL entry {entry!r}: env must be an environment's name or *")
        entries.append(PoolEntry(
            env=env, tasks=_number(entry, "tasks", fields["tasks"]),
            size=_number(entry, "size", fields.get("size", "1")),
            idle_s=float(_number(entry, "idle", fields.get("idle", "300"))),
            hang_s=float(_number(entry, "hang", fields.get("hang", "30"))),
        ))
    keys = [(e.env, e.tasks) for e in entries]
    if len(set(keys)) != len(keys):
        raise PoolConfigError("PARITY_POOL: two entries for the same env and tasks")
    return tuple(entries)


def entry_for(entries: tuple[PoolEntry, ...], env_name: str, tasks: int) -> PoolEntry | None:
    """The entry serving an environment at a world size: its own first, else the `*` one."""
    for wanted in (env_name, "*"):
        for entry in entries:
            if entry.env == wanted and entry.tasks == tasks:
                return entry
    return None
