"""The CUDA path in a world of one (marked ``cuda``: skipped, and listed by ``-rs``, without a
GPU and a CUDA build; scripts/gpu_check.sh runs them): NCCL collectives on CUDA tensors, and
DistributedOptimizer and synchronize_ on a CUDA model, whose fused buckets use the pack kernels
(csrc/cuda/pack_kernels.cu) and order streams with events (csrc/ops/stream_order.*)."""

from __future__ import annotations

import pytest
import torch

import fluxmpi_py as fm

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not fm.build_info()["compiled_with_cuda"],
        reason="needs a GPU and a CUDA build of fluxmpi_py (scripts/gpu_check.sh)",
    ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", ["sum", "average", "max"])
def test_collectives_on_cuda_tensors(dtype, op):
    fm.Init()
    t = torch.arange(1001, dtype=dtype, device="cuda")
    want = t.clone()
    fm.allreduce_(t, op)
    assert torch.equal(t, want)
    fm.bcast_(t, root_rank=0)
    assert torch.equal(t, want)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


@pytest.mark.parametrize("compression", [None, "fp16", "bf16"])
def test_distributed_optimizer_on_a_cuda_model_equals_plain_sgd(compression):
    fm.Init()
    ours, ref = _model().cuda(), _model().cuda()
    # a tiny bucket cap: several fused buckets, each packed by one kernel launch
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(ours.parameters(), lr=0.1), compression=compression, bucket_cap_mb=1e-4
    )
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = torch.randn(16, 8, device="cuda"), torch.randn(16, 1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    # The whole step on a side stream: the engine's stream must wait for backward's (the
    # gradients and their pack), and step() for the engine's.
    with torch.cuda.stream(side):
        for _ in range(3):
            for m, o in ((ours, opt), (ref, ref_opt)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                o.step()
    torch.cuda.synchronize()
    tol = 0 if compression is None else 1e-2
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_synchronize_a_cuda_model():
    fm.Init()
    m = _model().cuda()
    before = [p.detach().clone() for p in m.parameters()]
    fm.synchronize_(m, root_rank=0)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), before))
