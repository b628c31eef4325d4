"""The chaos benchmark's figures, computed afterwards from the database, the run folders and what the
clients saw: nothing here trusts the scheduler's own account of itself."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

TERMINAL = {"passed", "failed", "error", "cancelled"}
PG_GRACE_S = 15.0  # 5xx this long after Postgres is back still count as the restart's


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _first_after(times: list[float], t: float) -> float | None:
    later = [x for x in times if x >= t]
    return min(later) - t if later else None


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def doubles(job_ids: dict[str, set[str]], phases: list[dict[str, Any]]) -> list[str]:
    """Phases that reached Slurm more than once: a folder with two job ids, or more job ids than attempts."""
    found = [f"{folder}: jobs {sorted(ids)}" for folder, ids in job_ids.items() if len(ids) > 1]
    per_phase: dict[tuple[int, str], set[str]] = defaultdict(set)
    for folder, ids in job_ids.items():
        m = re.search(r"run-(\d+)/(train_and_save|resume)", folder)
        if m:
            per_phase[(int(m.group(1)), m.group(2))] |= ids
    attempts: dict[tuple[int, str], int] = defaultdict(int)
    for p in phases:
        attempts[(p["run_id"], p["name"])] += 1
    for key, ids in per_phase.items():
        if len(ids) > attempts.get(key, 0):
            found.append(f"run {key[0]} {key[1]}: {len(ids)} Slurm jobs for {attempts.get(key, 0)} attempt(s)")
    seen: dict[tuple[int, str, int], int] = defaultdict(int)
    for p in phases:
        seen[(p["run_id"], p["name"], p["attempt"])] += 1
    found += [f"run {k[0]} {k[1]} attempt {k[2]}: {n} rows" for k, n in seen.items() if n > 1]
    return found


def longest_stall(runs: list[dict[str, Any]], phases: list[dict[str, Any]], start: float, end: float) -> float:
    """Longest stretch in which runs were waiting but none of their phases was in Slurm (queued or running)."""
    busy = [(_ts(p["submitted_at"]), _ts(p["ended_at"]) or end) for p in phases if p["submitted_at"]]
    open_runs = [(_ts(r["created_at"]) or start, _ts(r["finished_at"]) or end) for r in runs]
    longest = current = 0.0
    t = start
    while t < end:
        waiting = any(a <= t < b for a, b in open_runs)
        in_slurm = any(a is not None and a <= t < b for a, b in busy)
        current = current + 1.0 if waiting and not in_slurm else 0.0
        longest = max(longest, current)
        t += 1.0
    return longest


def recoveries(rec: Any, runs: dict[int, dict[str, Any]], phases: list[dict[str, Any]],
               events: list[float]) -> list[tuple[str, str]]:
    """(fault, time to recover) for each fault that was injected."""
    out = []
    submits = sorted(t for p in phases if (t := _ts(p["submitted_at"])))
    for name, info in rec.faults.items():
        if name == "garbage requests":
            statuses = info.get("statuses", {})
            worst = max(statuses.values()) if statuses else 0
            out.append((name, f"n/a (answers {sorted(set(statuses.values()))}, worst {worst})"))
        elif name == "two scheduler replicas":
            out.append((name, "n/a (see submitted twice)"))
        elif name.startswith("SIGKILL"):
            out.append((name, f"replica beating again after {_fmt(info.get('back_s'))} (killed at once, restarted "
                               f"3 s later); next state change {_fmt(_first_after(events, info['at']))}"))
        elif name == "scancel a running phase":
            retry = [p for p in phases if p["run_id"] == info["run_id"] and p["name"] == info["phase"]
                     and p["attempt"] > info["attempt"] and (p["started_at"] or p["submitted_at"])]
            t = min((_ts(p["started_at"] or p["submitted_at"]) or 0.0 for p in retry), default=None)
            out.append((f"{name} (run {info['run_id']} {info['phase']})",
                        f"retry running after {_fmt(t - info['at'] if t else None)}"))
        elif name == "sbatch fails" and "until" in info:
            gap = _first_after(submits, info["until"])
            out.append((f"{name} ({info['until'] - info['at']:.0f} s)", f"next submission {_fmt(gap)} after"))
        elif name == "Postgres restart" and "until" in info:
            out.append((f"{name} (down {info['until'] - info['at']:.0f} s)",
                        f"API {_fmt(info.get('api_back_s'))}, progress {_fmt(_first_after(events, info['until']))}"))
    for run_id, run in sorted(runs.items()):
        kind = (run["labels"] or {}).get("chaos")
        if kind in ("nan", "kill") and run["finished_at"]:
            took = (_ts(run["finished_at"]) or 0.0) - (_ts(run["created_at"]) or 0.0)
            label = "NaN loss from a rank" if kind == "nan" else "rank killed mid-phase"
            out.append((f"{label} (run {run_id})", f"{run['state']} after {took:.0f} s, others kept moving"))
    return out


def report(db: str, rec: Any, started: float, ended: float, expected: dict[str, set[str]],
           job_ids: dict[str, set[str]], work: Path) -> dict[str, Any]:
    """All figures and a Markdown table."""
    with psycopg.connect(db, connect_timeout=10, row_factory=dict_row) as conn:
        runs: dict[int, dict[str, Any]] = {r["id"]: r for r in conn.execute(
            "select id, state, labels, created_at, finished_at, error_message from runs order by id")}
        phases: list[dict[str, Any]] = list(conn.execute(
            "select run_id, name, attempt, state, job_id, folder, submitted_at, started_at, ended_at, exit_reason "
            "from phases order by id"))
        events = sorted(_ts(r["at"]) or 0.0 for r in conn.execute("select at from run_events"))
    accepted = rec.accepted
    wrong = {i: (a["kind"], runs[i]["state"]) for i, a in accepted.items()
             if i in runs and runs[i]["state"] not in expected[a["kind"]]}
    lost = sorted(i for i in accepted if i not in runs or runs[i]["state"] not in TERMINAL)
    twice = doubles(job_ids, phases)
    pg = rec.faults.get("Postgres restart", {})
    lo, hi = pg.get("at", 0.0), pg.get("until", 0.0) + PG_GRACE_S
    five = [(t, s, w) for t, s, w in rec.answers if s >= 500]
    outside = [x for x in five if not lo <= x[0] <= hi]
    stall = longest_stall(list(runs.values()), phases, started, max(
        [ended, *(_ts(r["finished_at"]) or 0.0 for r in runs.values())]))
    right = len(accepted) - len(wrong) - len([i for i in lost if i not in wrong])
    rows = [
        ("runs accepted", str(len(accepted))),
        ("finished with the right verdict", f"{right} / {len(accepted)}"),
        ("lost", str(len(lost))),
        ("submitted twice", str(len(twice))),
        ("server 5xx outside the Postgres restart", f"{len(outside)} (inside: {len(five) - len(outside)})"),
        ("requests answered", f"{len(rec.answers)} ({sum(1 for a in rec.answers if a[1] == 0)} without answer)"),
        ("Slurm jobs", f"{len({i for ids in job_ids.values() for i in ids})} for {len(phases)} phase attempts"),
        ("longest queue stall", f"{stall:.0f} s"),
        ("wall time", f"{(ended - started) / 60:.1f} min"),
        *[(f"recover: {k}", v) for k, v in recoveries(rec, runs, phases, events)],
    ]
    table = "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    return {
        "ok": not lost and not twice and not wrong and not outside,
        "table": table, "rows": rows, "wrong": wrong, "lost": lost, "submitted_twice": twice,
        "server_5xx_outside": outside, "faults": rec.faults, "work": str(work),
        "runs": {i: {"kind": a["kind"], "state": runs.get(i, {}).get("state"),
                     "error": runs.get(i, {}).get("error_message")} for i, a in accepted.items()},
    }
