"""Dashboard load benchmark: server time of the HTML pages with 100k runs and 10M step_metrics rows.

    .venv/bin/python benchmarks/dashboard_load.py [--runs 100000] [--steps 100] [--requests 40] [--explain]
                                                   [--database NAME]

Creates a throw-away database on PARITY_BENCH_SERVER_URL (default: the local Postgres), migrates
it, seeds it with set-based SQL (runs × generate_series for the metrics: one statement per table
instead of a million round trips), then times each page in-process through TestClient (routing,
queries and template rendering; no network) and prints p50/p95. Drops the database at the end.
Target: p95 under 100 ms for every page; the overview's cost independent of history length (run it at
two --runs and compare). --database reuses (and keeps) a seeded database: 10M metric rows take minutes.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import history_summary
import psycopg
from sqlalchemy import make_url

ROOT = Path(__file__).resolve().parents[1]
SERVER = os.environ.get("PARITY_BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGET_MS = 100.0
CONFIGS = ["moe-fp32-router", "moe-fp32-router-gates", "dense-bf16", "equal-shards-fp32-head", "layerwise-empty-rank"]

SEED_SQL = """
INSERT INTO environments (name, python, description, packages, created_at)
SELECT e, '/opt/' || e || '/bin/python', 'bench',
       jsonb_build_object('torch', '2.13.0', 'megatron_core', '0.16.1'), now()
FROM unnest(ARRAY['default', 'mcore-main', 'mcore-0.15']) AS e;

-- Bulk rows skip the per-row triggers (session_replication_role, a superuser setting): the metric
-- rows' foreign-key checks were most of the seeding time, and the history summary is filled below in
-- one statement, as its migration fills it, rather than by 100k trigger calls in one transaction
SET session_replication_role = replica;

INSERT INTO runs (config, spec, environment_id, labels, state, state_version, updated_at, cancel_requested,
                  verdict, signatures, summary, regression, created_at, finished_at, max_abs_loss_delta,
                  first_divergent_step, first_step_beyond_tolerance, last_good_run_id, failing_since_run_id,
                  check_key, check_name, track)
SELECT c.config,
       jsonb_build_object('config', c.config, 'dp', 2, 'steps', %(steps)s, 'save_step', %(save)s,
                          'sharding', 'dp_reshardable', 'seed', 1234, 'tolerance', 'default',
                          'workarounds', '[]'::jsonb),
       1 + (i / 5) %% 3,
       jsonb_build_object('branch', CASE WHEN i %% 4 = 0 THEN 'release' ELSE 'main' END,
                          'commit', left(md5(i::text), 10)),
       CASE v.verdict WHEN 'pass' THEN 'passed' WHEN 'fail' THEN 'failed' ELSE 'error' END, 6, now(), false,
       v.verdict,
       CASE v.verdict WHEN 'fail' THEN '["optimizer-index-misalignment"]'::jsonb
                      WHEN 'error' THEN '["checkpoint-save-crash"]'::jsonb ELSE '[]'::jsonb END,
       jsonb_build_object('packages', jsonb_build_object('torch', '2.13.0', 'megatron_core', '0.16.1')),
       v.verdict = 'fail' AND i %% 2 = 0,
       now() - ((%(n)s - i) || ' minutes')::interval, now() - ((%(n)s - i) || ' minutes')::interval + interval '4 min',
       CASE v.verdict WHEN 'fail' THEN 1e-4 * (1 + i %% 50) WHEN 'pass' THEN 0.0 END,
       CASE WHEN v.verdict = 'fail' THEN %(save)s + 1 END,
       CASE WHEN v.verdict = 'fail' THEN %(save)s + 2 END,
       CASE WHEN v.verdict <> 'pass' AND i > 15 THEN i - 15 END,
       CASE WHEN v.verdict <> 'pass' THEN i END,
       -- the check identity service/core/checks.py would give (one check per config here), track = branch
       substr(md5(c.config), 1, 16), c.config || ' dp=2 steps=' || %(steps)s || ' save_step=' || %(save)s,
       CASE WHEN i %% 4 = 0 THEN 'release' ELSE 'main' END
FROM generate_series(1, %(n)s) AS i
CROSS JOIN LATERAL (SELECT (%(configs)s::text[])[1 + i %% 5] AS config) AS c
CROSS JOIN LATERAL (SELECT CASE WHEN i %% 23 = 0 THEN 'fail' WHEN i %% 37 = 0 THEN 'error' ELSE 'pass' END
                    AS verdict) AS v;

-- 10M metric rows: written without WAL into a table without its key, the key built once afterwards
-- (a throw-away database: the pages read the same rows and the same index either way)
ALTER TABLE step_metrics SET UNLOGGED;
ALTER TABLE step_metrics DROP CONSTRAINT pk_step_metrics;

INSERT INTO step_metrics (run_id, step, loss_baseline, loss_resumed, lr_baseline, lr_resumed, loss_abs_delta,
                          loss_rel_delta, within_tolerance)
SELECT r.id, s, m.base, m.res, 1e-3, CASE WHEN s > %(save)s THEN 1e-3 END, m.res - m.base,
       abs(m.res - m.base) / m.base, CASE WHEN s > %(save)s THEN abs(m.res - m.base) <= 1e-5 * m.base END
FROM runs r
CROSS JOIN generate_series(1, %(steps)s) AS s
CROSS JOIN LATERAL (SELECT 4.6 * exp(-s / 25.0) + 0.01 * sin(s + r.id) AS base) AS b
CROSS JOIN LATERAL (SELECT b.base,
       CASE WHEN s <= %(save)s THEN NULL
            WHEN r.verdict = 'fail' THEN b.base + 1e-5 * (s - %(save)s) ELSE b.base END AS res) AS m;

ALTER TABLE step_metrics ADD CONSTRAINT pk_step_metrics PRIMARY KEY (run_id, step);

RESET session_replication_role;

""" + history_summary.backfill_sql() + """;

INSERT INTO phases (run_id, name, attempt, state, executor, job_id, folder, submitted_at, started_at, ended_at,
                    duration_s, info, log_paths, created_at)
SELECT r.id, p.name, 1, 'succeeded', 'slurm', (r.id * 10 + p.k)::text, '/runs/run-' || r.id || '/' || p.name,
       r.created_at, r.created_at, r.finished_at, 95.0, '{}'::jsonb,
       jsonb_build_array('/runs/run-' || r.id || '/' || p.name || '/0_log.out'), r.created_at
FROM runs r CROSS JOIN (VALUES ('train_and_save', 1), ('resume', 2)) AS p(name, k);

INSERT INTO run_events (run_id, from_state, to_state, reason, at)
SELECT r.id, e.f, e.t, 'bench', r.created_at + e.k * interval '1 min'
FROM runs r CROSS JOIN (VALUES (NULL, 'queued', 0), ('queued', 'train_submitted', 1),
                               ('evaluating', 'passed', 4)) AS e(f, t, k);

INSERT INTO probe_findings (run_id, phase, probe, ok, param_name, detail)
SELECT r.id, 'train_and_save', 'index_map', false, 'decoder.layers.' || k || '.mlp.router.weight',
       jsonb_build_object('rank', 0, 'dtype', 'float32', 'group', 0, 'index', k, 'expected_index', 0,
                          'expected_numel', 512, 'installed_numel', 512, 'installed_param', 'gate')
FROM runs r CROSS JOIN generate_series(0, 2) AS k WHERE r.verdict = 'fail';

-- what autovacuum does to a table soon after a bulk insert: the visibility map set, so index-only
-- scans (the capped counts) read no heap, as they do on a service that has been running
VACUUM ANALYZE;
"""


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def seed(plain_url: str, runs: int, steps: int) -> None:
    """Fill the database with set-based INSERT … SELECT statements."""
    params = {"n": runs, "steps": steps, "save": steps // 2, "configs": CONFIGS}
    with psycopg.connect(plain_url, autocommit=True) as conn:
        for statement in filter(str.strip, SEED_SQL.split(";\n")):
            conn.execute(statement, params)
        counts = conn.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM step_metrics)").fetchone()
        assert counts is not None
    print(f"seeded {counts[0]:,} runs and {counts[1]:,} step_metrics rows")


def time_pages(pages: dict[str, list[str]], requests: int) -> bool:
    """Time every page through TestClient; print p50/p95; True when all p95 meet the target."""
    from fastapi.testclient import TestClient

    from service.web.app import create_app

    ok = True
    with TestClient(create_app()) as client:
        for name, urls in pages.items():
            client.get(urls[0])  # warm-up: connection pool, template compilation
            latencies = []
            for i in range(requests):
                t0 = time.perf_counter()
                response = client.get(urls[i % len(urls)])
                latencies.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, (urls[i % len(urls)], response.status_code)
            p50, p95 = statistics.median(latencies), percentile(latencies, 0.95)
            ok &= p95 < TARGET_MS
            print(f"{name:<36} n={requests:<4} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  "
                  f"{'ok' if p95 < TARGET_MS else 'SLOW'}")
    return ok


def explain(plain_url: str) -> None:
    """Print the plan and timing of the overview's DISTINCT ON query."""
    sql = ("EXPLAIN (ANALYZE, BUFFERS) SELECT DISTINCT ON (config, environment_id) id FROM runs "
           "WHERE verdict IS NOT NULL ORDER BY config, environment_id, finished_at DESC NULLS LAST, id DESC")
    with psycopg.connect(plain_url) as conn:
        for (line,) in conn.execute(sql):
            print("  " + line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=100, help="metric rows per run (runs × steps in all)")
    ap.add_argument("--requests", type=int, default=40, help="requests per page")
    ap.add_argument("--explain", action="store_true", help="print the overview query plan")
    ap.add_argument("--database", help="reuse this seeded database and keep it")
    args = ap.parse_args()

    name = args.database or f"parity_bench_dash_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(SERVER).set(database=name, drivername="postgresql+psycopg").render_as_string(False)
    plain = make_url(url).set(drivername="postgresql").render_as_string(False)
    try:
        sys.path.insert(0, str(ROOT))
        from service.core.db import reset_engine, upgrade
        from service.core.settings import get_settings

        upgrade(url)
        t0 = time.perf_counter()
        if not exists:
            seed(plain, args.runs, args.steps)
            print(f"seed time {time.perf_counter() - t0:.1f}s")
        os.environ["PARITY_DATABASE_URL"] = url
        get_settings.cache_clear()
        reset_engine()
        rng = random.Random(7)
        fails = [i for i in range(1, args.runs + 1) if i % 23 == 0]
        pages = {
            "GET / (matrix)": ["/"],
            "GET /runs": ["/runs"],
            "GET /runs?verdict=fail&sort=delta": ["/runs?verdict=fail&sort=delta&dir=desc"],
            "GET /runs?label=branch=main&page=40": ["/runs?label=branch%3Dmain&page=40"],
            "GET /runs/{id}": [f"/runs/{rng.randint(1, args.runs)}" for _ in range(args.requests)],
            "GET /runs/{id}/triage": [f"/runs/{rng.choice(fails)}/triage" for _ in range(args.requests)],
            "GET /configs/{name}": [f"/configs/{c}" for c in CONFIGS],
        }
        ok = time_pages(pages, args.requests)
        if args.explain:
            explain(plain)
        reset_engine()
    finally:
        if not args.database:
            with psycopg.connect(SERVER, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"target p95 < {TARGET_MS:.0f} ms: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
