"""The pool is visible: /api/v1/pool, /healthz's pool block, /metrics gauges and the dashboard page,
read from the workers' folders (a busy and an idle worker written here as a worker writes them)."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from jobs.pool_folder import PoolFolder, write_atomic
from service.core.settings import get_settings
from service.executors import pool


def _worker(name: str, state: str, order: str | None, gpus: int = 0) -> None:
    files = PoolFolder(pool.pool_root(get_settings()) / name)
    files.folder.mkdir(parents=True)
    write_atomic(files.record, {"env_id": 1, "env_name": "default", "tasks": 2, "executor": "slurm", "job_id": "77",
                                "started": None, "created": time.time() - 30, "hang_s": 30, "idle_s": 300,
                                **({"gpus": gpus} if gpus else {})})
    for rank in range(2):
        write_atomic(files.heartbeat(rank), {"state": state, "order": order, "since": time.time()})
    if order:
        files.place_order({"id": order, "kind": "attempt"})


def test_no_pool_shows_zero_workers(client: TestClient) -> None:
    assert client.get("/api/v1/healthz").json()["pool"]["workers"] == 0
    assert "parity_pool_worker_count 0.0" in client.get("/metrics").text


def test_the_pool_is_on_the_api_healthz_metrics_and_dashboard(client: TestClient) -> None:
    _worker("e1-t2-busy", "busy", "phase-3")
    _worker("e1-t2-idle", "idle", None)
    listed = client.get("/api/v1/pool").json()
    assert (listed["workers"], listed["busy"], listed["idle"]) == (2, 1, 1)
    states = {w["name"]: (w["state"], w["order"], w["environment"]) for w in listed["list"]}
    assert states == {"e1-t2-busy": ("busy", "phase-3", "default"), "e1-t2-idle": ("idle", None, "default")}
    assert listed["oldest_age_s"] >= 29
    health = client.get("/api/v1/healthz").json()["pool"]
    assert (health["workers"], health["busy"], health["idle"]) == (2, 1, 1) and "list" not in health
    metrics = client.get("/metrics").text
    assert "parity_pool_busy 1.0" in metrics and "parity_pool_idle 1.0" in metrics
    assert 'parity_pool_workers{environment="default",state="busy",tasks="2"} 1.0' in metrics
    page = client.get("/pool").text
    assert "e1-t2-busy" in page and "phase-3" in page and 'id="pool-workers"' in page


def test_a_workers_gpus_are_shown_beside_its_tasks(client: TestClient) -> None:
    """A worker for cuda checks holds a GPU per rank (its key's third part); one from before the field holds none."""
    _worker("e1-t2-g2-idle", "idle", None, gpus=2)
    _worker("e1-t2-idle", "idle", None)
    listed = {w["name"]: w["gpus"] for w in client.get("/api/v1/pool").json()["list"]}
    assert listed == {"e1-t2-g2-idle": 2, "e1-t2-idle": 0}
    page = client.get("/pool").text
    assert "<th>GPUs</th>" in page and "<td>2</td><td>slurm</td>" in page and "<td>—</td><td>slurm</td>" in page
