"""The spec's `device` (cpu | cuda) and how a rank follows it, proved on a CPU host.

What runs on a GPU is for benchmarks/gpu_gate.py; here: the field's rules and identity, what the run
plan asks the executor for, the binding a rank resolves (device, backend, the deterministic environment),
and that every tensor the harness makes goes to the bound device. For that last part the rank is bound
to torch's `meta` device: a tensor the harness left on the CPU then meets a meta one and torch raises
("Tensor on device cpu is not on the expected device meta"), as a CPU index met a cuda:0 embedding on the
H200 (index_select).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.protocol import RunPlan
from jobs.spec import DEVICES, RunSpec, SpecError, allowed_values
from service.core.checks import check_key

BASE = {"config": "moe-fp32-router", "dp": 2, "steps": 6, "save_step": 3}


def test_device_defaults_to_cpu_and_leaves_existing_specs_and_keys_alone() -> None:
    spec = RunSpec.from_dict(BASE)
    assert spec.device == "cpu" and "device" not in spec.to_dict()
    assert RunSpec.from_dict({**BASE, "device": "cpu"}).to_dict() == spec.to_dict()
    assert check_key(BASE) == "6181c90813ef1262"  # pinned in test_check_identity.py


def test_a_cuda_check_is_another_check() -> None:
    cuda = RunSpec.from_dict({**BASE, "device": "cuda"})
    assert cuda.to_dict()["device"] == "cuda"
    assert check_key(cuda.to_dict()) != check_key(BASE)  # CPU and GPU histories never mix


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "", 1, None, ["cuda"]])
def test_an_unknown_device_names_the_field_and_the_allowed_values(bad: Any) -> None:
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({**BASE, "device": bad})
    assert err.value.field == "device" and err.value.allowed == list(DEVICES)
    assert "allowed: cpu, cuda" in str(err.value)


@pytest.mark.parametrize("config", ["dense-fp8-te", "moe-grouped-gemm-te"])
def test_a_gpu_check_is_refused_on_cpu_and_taken_on_cuda(config: str) -> None:
    gpu = {"config": config, "dp": 1, "steps": 4, "save_step": 2}
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(gpu)
    assert err.value.field == "device" and err.value.allowed == ["cuda"] and "GPU check" in str(err.value)
    assert RunSpec.from_dict({**gpu, "device": "cuda"}).device == "cuda"
    assert config in allowed_values()["device"]["gpu_checks"]


@pytest.mark.parametrize(("extra", "per_node"), [
    ({}, 0),
    ({"device": "cuda"}, 2),
    ({"device": "cuda", "dp": 4, "nodes": 2}, 2),
    ({"device": "cuda", "dp": 2, "ep": 2}, 2),
])
def test_the_plan_asks_for_one_gpu_per_rank_on_cuda_and_none_on_cpu(extra: dict[str, Any], per_node: int) -> None:
    plan = RunPlan.of(RunSpec.from_dict({**BASE, **extra}))
    for phase in ("train_and_save", "resume"):
        assert plan.payload(Path("/runs/1"), phase).gpus_per_node == per_node  # type: ignore[arg-type]


def test_a_resharded_cuda_resume_asks_for_its_own_ranks() -> None:
    plan = RunPlan.of(RunSpec.from_dict({"config": "moe-fp32-router", "dp": 1, "resume_dp": 2, "steps": 6,
                                         "save_step": 3, "device": "cuda"}))
    assert plan.payload(Path("/r"), "train_and_save").gpus_per_node == 1
    assert plan.payload(Path("/r"), "resume").gpus_per_node == 2


def test_the_binding_follows_the_spec_not_the_host() -> None:
    from jobs.rank import device

    assert device.resolve("cpu", 3) == device.Binding("cpu", "gloo", "cpu")
    assert device.resolve("cuda", 3) == device.Binding("cuda:3", "nccl", "cuda")
    with pytest.raises(ValueError, match="allowed: cpu, cuda"):
        device.resolve("tpu")


def test_a_cpu_rank_hides_the_gpus_and_a_cuda_rank_sets_the_deterministic_knobs() -> None:
    from jobs.rank import device

    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert device.prepare_environment("cpu", env) == {"CUDA_VISIBLE_DEVICES": ""} and env["CUDA_VISIBLE_DEVICES"] == ""
    env = {"NCCL_ALGO": "Tree"}  # a value the operator set is kept
    set_now = device.prepare_environment("cuda", env)
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["NCCL_ALGO"] == "Tree"
    assert "NCCL_ALGO" not in set_now and env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"


def test_local_rank_comes_from_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.rank import device

    for key in ("LOCAL_RANK", "SUBMITIT_LOCAL_LOCALID", "SLURM_LOCALID"):
        monkeypatch.delenv(key, raising=False)
    assert device.local_rank() == 0
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert device.local_rank() == 2
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert device.local_rank() == 1


# --- with torch: binding and placement ---


@pytest.fixture
def meta_rank(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process's rank bound to torch's meta device (what a GPU binding does, with a device a CPU has)."""
    pytest.importorskip("torch")
    from jobs.rank import device

    monkeypatch.setattr(device, "_bound", device.Binding("meta", "gloo", "cpu"))
    return device


def test_bind_cpu_on_this_host_and_cuda_refused_as_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU host: benchmarks/gpu_gate.py runs cuda checks there")
    from jobs.rank import device
    from jobs.rank.compat import UnsupportedByBuild

    monkeypatch.setenv("LOCAL_RANK", "0")
    try:
        assert device.bind("cpu").backend == "gloo" and str(device.current()) == "cpu" and not device.is_cuda()
        with pytest.raises(UnsupportedByBuild, match="device 'cuda'.*sees no CUDA device"):
            device.bind("cuda")
        assert not device.is_cuda()  # a failed bind leaves the rank where it was
    finally:
        device.reset()


def test_the_gpt_batch_is_made_on_the_rank_device_from_the_cpu_generator(meta_rank: Any) -> None:
    import torch

    from jobs.configs import get_config
    from jobs.rank.model import gpt_batch

    cfg = get_config("dense-bf16")
    tok, pos = gpt_batch(cfg, torch.Generator().manual_seed(1))
    assert tok.device.type == "meta" and pos.device.type == "meta"
    assert tok.shape == (cfg.micro_batch_size, cfg.seq_length + 1)
    meta_rank.reset()  # on the CPU the same generator gives the same tokens on every device
    a, _ = gpt_batch(cfg, torch.Generator().manual_seed(1))
    b, _ = gpt_batch(cfg, torch.Generator().manual_seed(1))
    assert a.device.type == "cpu" and torch.equal(a, b)


def test_the_linear_stack_trains_on_the_rank_device(meta_rank: Any) -> None:
    import torch

    from jobs.configs import get_config
    from jobs.rank.model import _build_linear_stack

    net, forward = _build_linear_stack(get_config("equal-shards-fp32-head"))
    out = forward(net.to(meta_rank.current()), torch.Generator().manual_seed(1))  # a CPU input or target raises
    assert out.device.type == "meta"


def test_the_step_helpers_make_their_scalars_on_the_rank_device(meta_rank: Any) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    from jobs.rank import training

    training._set_aux_loss_scale(0.5)
    assert MoEAuxLossAutoScaler.main_loss_backward_scale.device.type == "meta"
    MoEAuxLossAutoScaler.set_loss_scale(__import__("torch").ones(()))  # leave Megatron's class state as found


# --- tolerance per device kind ---


def _entry(config: str, steps: int, save_step: int, loss: float) -> dict[str, Any]:
    return {"spec": {"config": config, "steps": steps, "save_step": save_step}, "factor": 4.0, "runs": 5,
            "build": {"device_name": "NVIDIA H200"},
            "bound": {"loss_rtol": loss, "metrics_rtol": 1e-4, "lr_atol": 1e-12,
                      "state_rtol": {"model": 1e-3, "main": 1e-3, "moments": 2e-3}}}


def test_a_cuda_default_check_is_judged_by_gpu_noise_kept_apart_from_the_cpu() -> None:
    from jobs.tolerance import TOLERANCE_PROFILES, noise_key
    from jobs.verdict.profile import judged_profile

    cpu = RunSpec.from_dict({**BASE, "tolerance": "default"})
    cuda = RunSpec.from_dict({**BASE, "tolerance": "default", "device": "cuda"})
    measured = {"entries": {noise_key("moe-fp32-router", 2, 3): _entry("moe-fp32-router", 6, 3, 2e-6)}}
    assert judged_profile(cpu, measured)[0] == TOLERANCE_PROFILES["default"]  # the CPU never reads GPU entries
    profile, error = judged_profile(cuda, measured)
    assert error is None and profile.loss_rtol == 2e-6 and "NVIDIA H200" in (profile.source or "")
    # unmeasured: the static default, saying where its bounds come from
    static, _ = judged_profile(cuda, {"entries": {}})
    assert static.loss_rtol == TOLERANCE_PROFILES["default"].loss_rtol and "CPU-simulated" in (static.source or "")


def test_a_cuda_reshard_is_never_judged_by_cpu_bounds() -> None:
    from jobs.tolerance import load_calibration, reshard_key
    from jobs.verdict.profile import judged_profile

    spec = {"config": "dense-bf16", "dp": 1, "resume_dp": 2, "steps": 10, "save_step": 5}
    cpu_file = load_calibration()
    profile, error = judged_profile(RunSpec.from_dict({**spec, "device": "cuda"}), cpu_file)
    assert error is not None and error["type"] == "NotCalibrated" and "cuda/dense-bf16:1->2" in error["message"]
    assert reshard_key("dense-bf16", 1, 2, 5) == "dense-bf16:1->2@5"  # CPU keys unchanged
