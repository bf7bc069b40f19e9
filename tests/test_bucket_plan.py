"""One bucket planner for both reduction paths (issue 48): DistributedOptimizer builds its
options once (``reduction_options``), and the default path's buckets and the exact path's
(``deterministic=True``: floats, and the int64 sums from three passes a step) are what
``C.plan_buckets`` (csrc/fusion/bucket_plan.cpp) makes of them, the exact path counting the
bytes its buffers hold per value (the int64 sums, which copy every value, with no direct
gradient). The exact sums' bits at 1-4 ranks: tests/test_reproducible.py."""

from __future__ import annotations

import pytest
import torch

import fluxmpi_py as fm
from fluxmpi_py._core import C
from fluxmpi_py.training import _exact_shards

f16, f32, f64 = torch.float16, torch.float32, torch.float64
# backward order reverses them; mixed dtypes, sizes around the caps below
SHAPES = [(900, f32), (5, f64), (70, f32), (10, f16), (2000, f32), (40, f64), (300, f32), (8, f32)]
# a cap of 4000 bytes, a first bucket of 1000 bytes per dtype, direct from 6000 bytes
KW = {"bucket_cap_mb": 4000 / 2**20, "first_bucket_cap_mb": 1000 / 2**20, "direct_min_bytes": 6000}
OPTIONS = C.PlanOptions(cap_bytes=4000, first_cap_bytes=1000, direct_min_bytes=6000)


def parameters():
    return [torch.nn.Parameter(torch.zeros(n, dtype=d)) for n, d in SHAPES]


def wrap(params, int64=False, **kw):
    """DistributedOptimizer over ``params``; ``int64``: the exact sums' int64 path, else their
    sharded float path at any k (by default from k = 3 the int64 path)."""
    fm.Init()
    kw = {**KW, **kw}
    most = _exact_shards.SHARDED_MAX_PASSES
    _exact_shards.SHARDED, _exact_shards.SHARDED_MAX_PASSES = not int64, 8
    try:
        return fm.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), check_every=0, **kw)
    finally:
        _exact_shards.SHARDED, _exact_shards.SHARDED_MAX_PASSES = True, most


def members(plan):
    return [b["members"] for b in plan]


@pytest.mark.parametrize(
    "kw, element_bytes, direct",
    [
        ({}, None, True),
        ({"deterministic": True}, None, True),
        ({"deterministic": True, "backward_passes_per_step": 2}, None, True),
        ({"deterministic": True, "backward_passes_per_step": 2, "int64": True}, 8, False),
    ],
    ids=["default", "exact_floats", "exact_floats_k2", "exact_int64"],
)
def test_each_path_plans_with_the_one_planner(kw, element_bytes, direct):
    params = parameters()
    opt = wrap(params, **kw)
    order = params[::-1]
    expected = C.plan_buckets(order, OPTIONS, ["cpu"] * len(order), element_bytes, direct)
    assert opt.buckets == expected
    if kw:  # the buckets the exact sums run (their start order and buffers)
        assert opt._exact is not None and opt._exact.buckets == members(expected)
        # and no default-path buckets beside them (issue 48): the plan keeps the order and
        # the requires_grad watch only
        assert opt._reducer.plan() == []
        assert opt._plan.order == order
        assert not opt._plan.requires_grad_changed()
        params[0].requires_grad_(False)
        assert opt._plan.requires_grad_changed()
    else:
        assert opt._reducer.plan() == expected


def test_first_bucket_cap_and_element_size_reach_the_exact_path():
    # The planner's rules seen through the optimizer, by hand. Backward order: 8, 300, 40 (f64),
    # 2000, 10 (f16), 70, 5 (f64), 900 values; per dtype the first bucket closes at 1000
    # bytes in both modes, later ones at 4000, and direct from 6000 bytes.
    params = parameters()
    floats = wrap(params, deterministic=True).buckets
    assert floats == wrap(params).buckets  # floats: bytes as the default path counts them
    assert members(floats) == [[0], [3], [1, 5], [2, 6], [4], [7]]
    assert [b["direct"] for b in floats] == [False, True, False, False, False, False]
    # int64 sums, 8 bytes a value and none direct (each value is copied into their buffers):
    # float32 takes 64, 2400, 16000, 560 and 7200 bytes
    assert wrap(params, deterministic=True, backward_passes_per_step=2).buckets == floats
    int64 = wrap(params, deterministic=True, backward_passes_per_step=2, int64=True).buckets
    assert members(int64) == [[0], [1], [3], [5], [2, 6], [4], [7]]
    assert not any(b["direct"] for b in int64)
    # without first_bucket_cap_mb the first float32 bucket takes 8, 300 and 70 values
    no_first = wrap(params, deterministic=True, first_bucket_cap_mb=None).buckets
    assert members(no_first) == [[3], [0, 1, 5], [2, 6], [4], [7]]


def make(kind, params, **kw):
    """The call that builds the reduction options of ``kind`` from ``kw``."""
    fm.Init()
    if kind == "allreduce_gradients":
        kw.pop("first_bucket_cap_mb")
        for p in params:
            p.grad = torch.ones_like(p)
        return fm.allreduce_gradients(params, **kw)
    return wrap(params, deterministic=kind == "exact", **kw)


@pytest.mark.parametrize("kind", ["optimizer", "exact", "allreduce_gradients"])
def test_sizes_are_checked_once_by_the_planners_options(kind):
    # the one check of each size: C.PlanOptions's (fusion/bucket_plan.cpp), in both modes and
    # in allreduce_gradients; byte_size only converts MiB to bytes
    for kw, error, match in [
        ({"bucket_cap_mb": 0}, ValueError, r"bucket cap must be positive \(bucket_cap_mb > 0\)"),
        ({"bucket_cap_mb": -1}, ValueError, "bucket cap must be positive"),
        ({"bucket_cap_mb": "1"}, TypeError, r"bucket_cap_mb=...\) takes a number, got str"),
        ({"bucket_cap_mb": float("nan")}, ValueError, "expected a size below"),
        ({"first_bucket_cap_mb": -1}, ValueError, "first bucket cap must be positive, or 0"),
        ({"direct_min_bytes": 0}, ValueError, "direct_min_bytes must be positive"),
    ]:
        if kind == "allreduce_gradients" and "first_bucket_cap_mb" in kw:
            continue
        with pytest.raises(error, match=match):
            make(kind, parameters(), **{**KW, **kw})
    make(kind, parameters(), **KW)  # and the good ones pass
