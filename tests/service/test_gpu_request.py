"""A `device: cuda` check asks the executor for one GPU per rank, and is refused at submit where there are fewer.

CPU-only: the local executor's job really runs and reports the CUDA_VISIBLE_DEVICES it was given; the
Slurm executor's batch script is read as sbatch would get it (sbatch itself is never called); POST /runs
answers a cuda check on this GPU-less host with a 422 naming what it needs and what there is. A cpu spec
asks for no GPU anywhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from fastapi.testclient import TestClient

from jobs.spec import RunSpec
from service.core.settings import Settings, get_settings
from service.executors import gpus, launcher
from service.runs.pool_dispatch import pool_key

cloudpickle.register_pickle_by_value(sys.modules[__name__])
SPEC = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


def visible_devices() -> str | None:
    """What a job process is given."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def _local(tmp_path: Path, gpus_per_node: int) -> str | None:
    settings = Settings(executor="local", run_folder=tmp_path / "runs")
    job = launcher.submit_phase(launcher.JobRequest(
        executor="local", folder=tmp_path / "runs" / "run-1" / "a1" / "submitit", python=sys.executable, tasks=1,
        name="gpu-probe", function=visible_devices, args=(), gpus_per_node=gpus_per_node,
    ), settings)
    try:
        result: str | None = launcher._LOCAL_JOBS[job.job_id].result()
        return result
    finally:
        launcher.end_job(job, settings)


def test_a_local_job_gets_the_gpus_it_asks_for_and_a_cpu_job_none(tmp_path: Path) -> None:
    assert _local(tmp_path / "cuda", 2) == "0,1"
    assert _local(tmp_path / "cpu", 0) == ""  # a cpu check on a GPU host sees no GPU


class _Captured(Exception):
    pass


def _sbatch_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus_per_node: int) -> str:
    seen: dict[str, str] = {}

    def capture(self: Any, path: Path) -> list[str]:
        seen["script"] = Path(path).read_text()
        raise _Captured  # sbatch is never run

    monkeypatch.setattr(launcher._SlurmExecutor, "_make_submission_command", capture)
    settings = Settings(executor="slurm", run_folder=tmp_path / "runs")
    with pytest.raises(_Captured):
        launcher.submit_phase(launcher.JobRequest(
            executor="slurm", folder=tmp_path / "runs" / "run-1" / "a1" / "submitit", python=sys.executable, tasks=4,
            nodes=2, name="gpu-probe", function=visible_devices, args=(), gpus_per_node=gpus_per_node,
        ), settings)
    return seen["script"]


def test_a_slurm_job_asks_for_gpus_per_node_and_a_cpu_job_for_none(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _sbatch_script(tmp_path / "cuda", monkeypatch, 2)
    assert "#SBATCH --gpus-per-node=2" in cuda and "#SBATCH --ntasks-per-node=2" in cuda
    cpu = _sbatch_script(tmp_path / "cpu", monkeypatch, 0)
    assert "--gpus" not in cpu and "--gres" not in cpu


def test_gres_strings_count_gpus() -> None:
    assert gpus.gres_gpus("gpu:h200:8(S:0-1)") == 8
    assert gpus.gres_gpus("gpu:4,shard:8") == 4
    assert gpus.gres_gpus("gpu:a100:2,gpu:h100:2") == 4
    assert gpus.gres_gpus("(null)") == 0 and gpus.gres_gpus("") == 0


def test_host_gpus_reads_the_driver_list(tmp_path: Path) -> None:
    for bus in ("0000:19:00.0", "0000:3b:00.0"):
        (tmp_path / bus).mkdir()
    assert gpus.host_gpus(tmp_path) == 2


def test_needed_per_node_is_one_per_rank_of_the_largest_phase() -> None:
    assert gpus.needed_per_node(RunSpec.from_dict(SPEC)) == 0
    assert gpus.needed_per_node(RunSpec.from_dict({**SPEC, "device": "cuda"})) == 2
    assert gpus.needed_per_node(RunSpec.from_dict({**SPEC, "dp": 1, "resume_dp": 2, "device": "cuda"})) == 2
    assert gpus.needed_per_node(RunSpec.from_dict({**SPEC, "dp": 4, "nodes": 2, "device": "cuda"})) == 2


def test_a_warm_workers_key_holds_its_gpus_so_cpu_and_cuda_attempts_never_share_one() -> None:
    assert pool_key(7, 2, RunSpec.from_dict(SPEC).to_dict()) == (7, 2, 0) and pool_key(7, 1, None) == (7, 1, 0)
    assert pool_key(7, 2, RunSpec.from_dict({**SPEC, "device": "cuda"}).to_dict()) == (7, 2, 2)


def test_a_warm_worker_for_cuda_checks_asks_for_a_gpu_per_rank_and_one_for_cpu_checks_for_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's workers ask the executor as a cold job does (what the executor then gives a job asking for
    GPUs is the first test's): a cuda key's worker asks for one GPU per rank, which every attempt child it forks
    inherits, a cpu key's for none; its key and its public view say which."""
    from service.core.pool_config import PoolEntry
    from service.executors import pool

    asked: list[int] = []

    def submit(request: launcher.JobRequest, _settings: Settings) -> launcher.PhaseJob:  # asked; nothing started
        asked.append(request.gpus_per_node)
        return launcher.PhaseJob(executor="local", folder=str(request.folder), job_id="1", tasks=request.tasks)

    monkeypatch.setattr(launcher, "submit_phase", submit)
    settings = Settings(executor="local", run_folder=tmp_path / "runs")
    for held in (2, 0):
        worker = pool.start_worker(settings, "local", env_id=1, env_name="default", python=sys.executable,
                                   entry=PoolEntry(env="default", tasks=2), gpus=held)
        assert worker.key == (1, 2, held) and pool.view(settings, worker, None).public()["gpus"] == held
    assert asked == [2, 0]


@pytest.fixture
def local_settings(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PARITY_EXECUTOR", "local")
    monkeypatch.delenv("PARITY_GPUS", raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_a_cuda_check_on_this_gpu_less_host_is_a_422_naming_need_and_have(
    client: TestClient, make_token: Any, local_settings: Any
) -> None:
    if gpus.host_gpus():
        pytest.skip("this host has GPUs")
    headers = make_token("submit")
    resp = client.post("/api/v1/runs", json={"spec": {**SPEC, "device": "cuda"}}, headers=headers)
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["field"] == "spec.device"
    assert "needs 2 GPU(s) per node" in body["detail"] and "this host (the local executor) has 0" in body["detail"]
    assert client.post("/api/v1/runs", json={"spec": SPEC}, headers=headers).status_code == 202  # cpu: as before


def test_declared_gpus_admit_a_cuda_check_that_fits_and_refuse_one_that_does_not(
    client: TestClient, make_token: Any, local_settings: Any
) -> None:
    local_settings.setenv("PARITY_GPUS", "2")
    get_settings.cache_clear()
    headers = make_token("submit")
    ok = client.post("/api/v1/runs", json={"spec": {**SPEC, "device": "cuda"}}, headers=headers)
    assert ok.status_code == 202, ok.text
    assert ok.json()["spec"]["device"] == "cuda"
    big = client.post("/api/v1/runs", json={"spec": {**SPEC, "dp": 4, "device": "cuda"}}, headers=headers)
    assert big.status_code == 422 and "PARITY_GPUS has 2" in big.json()["detail"]


def test_an_unknown_device_is_a_422_naming_the_allowed_values(client: TestClient, make_token: Any) -> None:
    resp = client.post("/api/v1/runs", json={"spec": {**SPEC, "device": "gpu"}}, headers=make_token("submit"))
    assert resp.status_code == 422 and resp.json()["field"] == "spec.device"
    assert "allowed: cpu, cuda" in resp.json()["detail"]


def _queued(client: TestClient) -> int:
    return len(client.get("/api/v1/runs", params={"limit": 500}).json()["items"])


def test_every_route_that_queues_runs_refuses_a_cuda_check_that_does_not_fit_and_queues_nothing(
    client: TestClient, make_token: Any, local_settings: Any
) -> None:
    """A suite, a sweep, a rerun and a bisect queue runs through the same admission as POST /runs: a cuda check
    with more ranks than PARITY_GPUS is a 422 naming the check (its suite check, its sweep cell), and nothing of
    the request is queued (the suite's cpu checks neither)."""
    local_settings.setenv("PARITY_GPUS", "2")
    get_settings.cache_clear()
    admin, submit = make_token("admin"), make_token("submit")
    suite = {"name": "gpu-mixed", "checks": [
        {"name": "cpu-dp2", "spec": SPEC},
        {"name": "cuda-dp4", "spec": {**SPEC, "dp": 4, "device": "cuda"}},
    ]}
    assert client.post("/api/v1/suites", json=suite, headers=admin).status_code == 201  # defined anywhere
    before = _queued(client)
    resp = client.post("/api/v1/suite-runs", json={"suite": "gpu-mixed"}, headers=submit)
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == "checks[1].spec.device"
    assert "checks[1] (cuda-dp4)" in resp.json()["detail"] and "PARITY_GPUS has 2" in resp.json()["detail"]

    sweep = {"configs": ["moe-fp32-router"], "environments": ["default"],
             "base": {"dp": 2, "steps": 6, "save_step": 3, "device": "cuda"}, "variations": [{}, {"dp": 4}]}
    resp = client.post("/api/v1/sweeps", json=sweep, headers=submit)
    assert resp.status_code == 422 and resp.json()["field"] == "spec.device", resp.text
    assert "variation 'dp=4' with config 'moe-fp32-router'" in resp.json()["detail"]

    resp = client.post("/api/v1/bisects", json={"spec": {**SPEC, "dp": 4, "device": "cuda"}, "good": "default",
                                                "bad": "default"}, headers=submit)
    assert resp.status_code == 422 and resp.json()["field"] == "spec.device", resp.text
    assert _queued(client) == before  # nothing of any refused request

    fits = client.post("/api/v1/runs", json={"spec": {**SPEC, "device": "cuda"}}, headers=submit)
    assert fits.status_code == 202, fits.text
    local_settings.setenv("PARITY_GPUS", "1")  # the host lost a GPU since: its rerun no longer fits
    get_settings.cache_clear()
    rerun = client.post(f"/api/v1/runs/{fits.json()['id']}/rerun", headers=submit)
    assert rerun.status_code == 422 and "PARITY_GPUS has 1" in rerun.json()["detail"], rerun.text
    assert _queued(client) == before + 1
