"""The CPU shims route CUDA requests to the CPU while installed, and leave torch exactly as it was after.

They are plain attribute patches (no TorchFunctionMode: a mode runs Python on every torch call of a
step), so each way Megatron-Core asks for a CUDA tensor is checked here by itself.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from jobs.rank import cpu_shim  # noqa: E402

pytestmark = pytest.mark.megatron


@pytest.fixture()
def shims():
    if not cpu_shim.needed():
        pytest.skip("CUDA is available: the shims are not installed on a GPU host")
    assert cpu_shim.install()
    try:
        yield
    finally:
        cpu_shim.uninstall()


def test_cuda_requests_land_on_the_cpu_while_installed(shims) -> None:
    for made in (torch.zeros(3, device="cuda"), torch.empty(2, 2, device=torch.device("cuda", 0)),
                 torch.tensor([1.0], device="cuda:0"), torch.arange(4, device=0),
                 torch.ones(2).new_zeros(3, device="cuda"), torch.full((2,), 7.0, device="cuda"),
                 torch.ones(2).to("cuda"), torch.ones(2).to(device="cuda", dtype=torch.bfloat16),
                 torch.ones(2).cuda(), torch.nn.Linear(2, 2).cuda().weight):
        assert made.device.type == "cpu"
    assert torch.ones(2).to(torch.float64).dtype == torch.float64  # a dtype alone is untouched
    # the optimizer dispatches on CUDA type names
    assert torch.ones(2, dtype=torch.bfloat16).type() == "torch.cuda.BFloat16Tensor"
    assert torch.ones(2).type("torch.cuda.HalfTensor").dtype == torch.float16
    assert torch.cuda.current_device() == torch.device("cpu")


def test_uninstall_leaves_torch_as_it_found_it() -> None:
    if not cpu_shim.needed():
        pytest.skip("CUDA is available: the shims are not installed on a GPU host")
    before = {name: torch.Tensor.__dict__.get(name) for name in ("to", "type", "cuda", "new_zeros")}
    zeros, stance = torch.zeros, torch._dynamo.eval_frame._stance.stance
    cpu_shim.install()
    assert torch.zeros is not zeros and torch._dynamo.eval_frame._stance.stance == "force_eager"
    cpu_shim.uninstall()
    assert torch.zeros is zeros and torch._dynamo.eval_frame._stance.stance == stance
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before
    assert torch.ones(2).type() == "torch.FloatTensor"
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")
