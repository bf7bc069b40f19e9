"""The bucket plan for CUDA gradients (csrc/fusion/bucket_plan.cpp), without a GPU: the
planner is pure, and ``plan_buckets(..., devices=[...])`` plans host tensors as if they lived
on CUDA. On CUDA every gradient is fused, as in DDP (one pack and one NCCL call per bucket,
issue 31); host tensors keep the measured CPU rule (1 MiB and up go direct)."""

from __future__ import annotations

import pytest
import torch

from fluxmpi_py._core import C

MiB = 1 << 20


def floats(*mib):
    """Float32 tensors of these sizes in MiB (the planner reads only dtype and numel)."""
    return [torch.empty(int(m * MiB) // 4) for m in mib]


def members(plan):
    return [b["members"] for b in plan]


# ResNet-50-like: many small gradients and a few large ones, in backward order
SIZES = [8, 0.01, 2.25, 0.01, 9, 0.5, 2.25, 0.02, 1, 4, 0.001]


def test_cuda_gradients_are_fused_by_default():
    ts = floats(*SIZES)
    opts = C.PlanOptions()  # the defaults DistributedOptimizer uses
    cuda = C.plan_buckets(ts, opts, devices=["cuda:0"] * len(ts))
    assert not any(b["direct"] for b in cuda)
    assert all(b["device"] == "cuda:0" for b in cuda)
    # 25 MiB cap: 8+0.01+2.25+0.01+9+0.5+2.25+0.02+1 = 23.04 fits; +4 does not
    assert members(cuda) == [list(range(9)), [9, 10]]
    assert [b["numel"] * 4 for b in cuda] == [sum(t.numel() * 4 for t in ts[:9]), 4 * MiB + 1048]
    # the CPU defaults are unchanged: each tensor of 1 MiB or more alone, in its own storage
    host = C.plan_buckets(ts, opts)
    direct = [b["members"] for b in host if b["direct"]]
    assert direct == [[0], [2], [4], [6], [8], [9]]
    assert [b["members"] for b in host if not b["direct"]] == [[1, 3, 5, 7, 10]]


def test_cuda_direct_threshold_is_an_option():
    ts = floats(*SIZES)
    opts = C.PlanOptions(cuda_direct_min_bytes=MiB)  # the old rule, applied to CUDA
    cuda = C.plan_buckets(ts, opts, devices=["cuda:0"] * len(ts))
    host = C.plan_buckets(ts, opts)
    assert members(cuda) == members(host)
    # and the host threshold leaves CUDA tensors alone
    opts = C.PlanOptions(direct_min_bytes=4096)
    assert not any(b["direct"] for b in C.plan_buckets(ts, opts, devices=["cuda:1"] * len(ts)))


def test_first_bucket_is_small_per_dtype_and_device():
    # DDP's first bucket (1 MiB): the first reduction starts early in backward
    ts = floats(0.5, 0.25, 0.5, 0.5, 3, 0.5)
    devs = ["cuda:0"] * len(ts)
    plan = C.plan_buckets(ts, C.PlanOptions(first_cap_bytes=MiB), devices=devs)
    assert members(plan) == [[0, 1], [2, 3, 4, 5]]
    assert members(C.plan_buckets(ts, C.PlanOptions(), devices=devs)) == [list(range(6))]
    # one first bucket per (dtype, device): the host tensors get theirs too
    ts = floats(0.5, 0.25, 0.5, 0.75, 3, 0.5)
    mixed = C.plan_buckets(ts, C.PlanOptions(first_cap_bytes=MiB), devices=devs[:3] + ["cpu"] * 3)
    assert members(mixed) == [[0, 1], [4], [3], [2], [5]]
    assert [b["direct"] for b in mixed] == [False, True, False, False, False]
    assert [b["device"] for b in mixed] == ["cuda:0", "cpu", "cpu", "cuda:0", "cpu"]
    # a tensor larger than the first cap still opens it alone
    assert members(
        C.plan_buckets(floats(2, 0.5), C.PlanOptions(first_cap_bytes=MiB), devs[:2])
    ) == [
        [0],
        [1],
    ]


def test_bad_options_and_devices_raise():
    ts = floats(1, 1)
    with pytest.raises(ValueError, match="first bucket cap must be positive, or 0"):
        C.plan_buckets(ts, C.PlanOptions(first_cap_bytes=-1))
    with pytest.raises(ValueError, match="direct_min_bytes must be positive"):
        C.plan_buckets(ts, C.PlanOptions(cuda_direct_min_bytes=0))
    with pytest.raises(ValueError, match="2 tensors but 1 devices"):
        C.plan_buckets(ts, C.PlanOptions(), devices=["cuda:0"])


def test_distributed_optimizer_passes_the_options_to_its_plan():
    import fluxmpi_py as fm

    fm.Init()
    params = [torch.nn.Parameter(t) for t in floats(0.5, 0.75, 2)]
    opt = fm.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), first_bucket_cap_mb=1)
    # backward order: the plan sees the parameters reversed (2, 0.75, 0.5 MiB)
    plan = opt._plan.reducer.plan()
    assert [(b["members"], b["direct"]) for b in plan] == [([0], True), ([1], False), ([2], False)]
    opt = fm.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))
    assert [b["members"] for b in opt._plan.reducer.plan()] == [[0], [1, 2]]
    with pytest.raises(ValueError, match="first bucket cap must be positive, or 0 for none"):
        fm.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), first_bucket_cap_mb=-1)
