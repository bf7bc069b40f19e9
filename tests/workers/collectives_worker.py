"""Collectives at any world size: every dtype, op, root and size (0, 1, odd), against closed
forms; non-contiguous tensors; 16-bit accumulation; async requests; bad input on every rank.

Run by tests/test_collectives.py under mpiexec at 1, 2 and 4 ranks (and once without mpiexec).
"""

import functools
import io
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import only_at, raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
]
SIZES = [0, 1, 7, 1023]
OPS = ["sum", "average", "min", "max", "prod"]


def rank():
    return fm.local_rank()


def world():
    return fm.total_workers()


def value(op, dtype, r, i):
    """Rank r's element i: small integers, exact in every dtype, and so are the results
    (sums within +-20, products within +-16 for up to 4 ranks)."""
    signed = dtype != torch.uint8
    if op == "prod":
        return ([1, -1, 2, -2] if signed else [1, 2, 3, 1])[(r + i) % 4]
    v = (r * 5 + i * 3) % 11
    return v - 5 if signed else v


def expected(op, dtype, n, i):
    vals = [value(op, dtype, r, i) for r in range(n)]
    if op == "sum":
        return sum(vals)
    if op == "prod":
        return math.prod(vals)
    if op == "min":
        return min(vals)
    if op == "max":
        return max(vals)
    if dtype.is_floating_point:
        return sum(vals) / n  # exact: n is 1, 2 or 4
    return sum(vals) // n  # the floor of the mean


def filled(op, dtype, size, r):
    return torch.tensor([value(op, dtype, r, i) for i in range(size)], dtype=dtype)


def expect_tensor(op, dtype, size, n):
    return torch.tensor([expected(op, dtype, n, i) for i in range(size)], dtype=dtype)


def check_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got, want)
    assert torch.equal(got, want), f"{what}: got {got.tolist()[:8]}, want {want.tolist()[:8]}"


# ---------------------------------------------------------------- closed forms


def case_allreduce_rank_plus_one():
    n = world()
    for dtype in DTYPES:
        t = torch.full((5,), rank() + 1, dtype=dtype)
        out = fm.allreduce_(t)
        assert out is t
        check_equal(t, torch.full((5,), n * (n + 1) // 2, dtype=dtype), f"sum {dtype}")
    t = torch.full((3,), float(rank() + 1))
    check_equal(fm.allreduce_(t, op="max"), torch.full((3,), float(n)), "max")
    check_equal(fm.allreduce_(torch.full((3,), float(rank() + 1)), op="min"), torch.ones(3), "min")
    check_equal(
        fm.allreduce_(torch.full((3,), float(rank() + 1)), op="average"),
        torch.full((3,), (n + 1) / 2),
        "average",
    )
    check_equal(
        fm.allreduce_(torch.full((3,), rank() + 1, dtype=torch.int64), op="prod"),
        torch.full((3,), math.factorial(n), dtype=torch.int64),
        "prod",
    )


def case_allreduce_every_dtype_op_size():
    n, r = world(), rank()
    for dtype in DTYPES:
        for op in OPS:
            for size in SIZES:
                t = filled(op, dtype, size, r)
                fm.allreduce_(t, op=op)
                check_equal(
                    t, expect_tensor(op, dtype, size, n), f"allreduce_ {op} {dtype} [{size}]"
                )


def case_allreduce_large_buffer():
    # Large enough for MPI's segmented / ring algorithms, not only the small-message path.
    n, r = world(), rank()
    size = 300_001
    for dtype in (torch.float32, torch.float16, torch.int32):
        t = torch.arange(size, dtype=torch.float64).remainder(7).to(dtype) + r
        fm.allreduce_(t)
        want = (torch.arange(size, dtype=torch.float64).remainder(7) * n + n * (n - 1) // 2).to(
            dtype
        )
        check_equal(t, want, f"large sum {dtype}")


def check_ring_sum_and_average(dtype, numel, what):
    """Sum and average of `numel` elements of `dtype`, against closed forms; the average's bits
    must be the same on every rank. Returns how many of the three allreduces took the ring."""
    n, r = world(), rank()
    before = C.ring_calls()
    base = torch.arange(numel, dtype=torch.float64).remainder(13)
    t = (base * (r + 1) + r).to(dtype)
    fm.allreduce_(t)
    want = (base * (n * (n + 1) // 2) + n * (n - 1) // 2).to(dtype)
    check_equal(t, want, f"{what}: sum {dtype} [{numel}]")
    # Values whose average is inexact: every rank must still hold the same bits.
    a = (torch.rand(numel, generator=torch.Generator().manual_seed(r)) * 3).to(dtype)
    mine = a.clone()
    fm.allreduce_(a, op="average")
    total = fm.allreduce_(mine.to(torch.float64), op="sum")
    assert torch.allclose(a.to(torch.float64), total / n, rtol=1e-6, atol=1e-6), (
        what,
        dtype,
        numel,
    )
    first = a.clone()
    fm.bcast_(first, root_rank=0)
    assert torch.equal(first, a), f"{what}: average {dtype} [{numel}]: ranks differ"
    return C.ring_calls() - before


@only_at(2, 3)  # 16 MiB tensors, ~6 s at 4 ranks on 2 cores; 3 is the uneven split
def case_ring_allreduce_sizes_and_identical_bits():
    # With the default RingOptions, float32/float64 averages of >= 1 MiB and sums of >= 16 MiB
    # take fluxmpi's own ring (reduce-scatter, then allgather); "average" divides inside its
    # last reduction step. Sizes that do not split evenly over the ranks, at the thresholds.
    n, o = world(), C.ring_options()  # the defaults, unless FLUXMPI_RING_MIN_BYTES is set
    on = o.enabled and n > 1
    sum_from = o.sum_min_bytes if on else float("inf")
    average_from = min(o.sum_min_bytes, o.average_min_bytes) if on else float("inf")
    for dtype in (torch.float32, torch.float64):
        esz = torch.tensor([], dtype=dtype).element_size()
        for numel in (
            (1 << 20) // esz - 1,
            (1 << 20) // esz,
            300_007,
            2_000_003,
            (16 << 20) // esz + 5,
        ):
            rings = check_ring_sum_and_average(dtype, numel, "default ring")
            # the sum in dtype, the average, the check's sum in float64
            want = (
                (numel * esz >= sum_from) + (numel * esz >= average_from) + (numel * 8 >= sum_from)
            )
            assert rings == want, f"{dtype} [{numel}]: {rings} ring calls, expected {want}"


def case_ring_multi_segment_small_inputs():
    # RingOptions with tiny thresholds and segments (set alike on every rank) send small
    # buffers through the ring in many segments of 8 to 24 bytes: chunks that are empty (fewer
    # elements than ranks), uneven (one element shorter) and of many segments.
    n = world()
    saved = C.ring_options()
    C.set_ring_options(
        C.RingOptions(
            sum_min_bytes=1, average_min_bytes=1, min_segment_bytes=8, max_segment_bytes=24
        )
    )
    try:
        for dtype in (torch.float32, torch.float64):
            for numel in (1, 2, 3, 5, 7, 64, 1001):
                rings = check_ring_sum_and_average(dtype, numel, "small ring")
                assert rings == (3 if n > 1 else 0), f"{dtype} [{numel}]: {rings} ring calls"
    finally:
        C.set_ring_options(saved)
    assert C.ring_options() == saved


def case_bcast_every_dtype_root_size():
    n, r = world(), rank()
    for dtype in DTYPES:
        for root in range(n):
            for size in SIZES:
                t = filled("sum", dtype, size, r)
                out = fm.bcast_(t, root_rank=root)
                assert out is t
                check_equal(
                    t, filled("sum", dtype, size, root), f"bcast_ {dtype} root {root} [{size}]"
                )


def case_reduce_every_dtype_op_root_size():
    n, r = world(), rank()
    for dtype in DTYPES:
        for op in OPS:
            for root in range(n):
                for size in SIZES:
                    t = filled(op, dtype, size, r)
                    before = t.clone()
                    ptr = t.data_ptr()
                    out = fm.reduce_(t, op=op, root_rank=root)
                    assert out is t and t.data_ptr() == ptr
                    want = expect_tensor(op, dtype, size, n) if r == root else before
                    check_equal(t, want, f"reduce_ {op} {dtype} root {root} [{size}] on rank {r}")


def case_bool():
    n, r = world(), rank()
    t = torch.tensor([r == 0, True, False])
    fm.allreduce_(t, op="max")
    check_equal(t, torch.tensor([True, True, False]), "bool max")
    t = torch.tensor([r == 0, True, False])
    fm.allreduce_(t, op="min")
    check_equal(t, torch.tensor([n == 1, True, False]), "bool min")


# ---------------------------------------------------------------- layouts


def case_noncontiguous_allreduce():
    n, r = world(), rank()
    base = torch.arange(35, dtype=torch.float32).reshape(5, 7) + r
    view = base.t()  # transposed: 7 x 5, not contiguous
    assert not view.is_contiguous()
    fm.allreduce_(view)
    want = torch.arange(35, dtype=torch.float32).reshape(5, 7) * n + n * (n - 1) / 2
    check_equal(base, want, "transposed view, seen through its base")

    base = torch.full((20,), float(r + 1))
    sl = base[1::3]  # strided slice with a storage offset
    fm.allreduce_(sl, op="sum")
    want = torch.full((20,), float(r + 1))
    want[1::3] = n * (n + 1) / 2
    check_equal(base, want, "strided slice: only the slice changes")

    base = torch.full((4, 6), rank() + 1, dtype=torch.float16)
    col = base[:, 2]
    fm.allreduce_(col, op="average")
    want = torch.full((4, 6), rank() + 1, dtype=torch.float16)
    want[:, 2] = (n + 1) / 2
    check_equal(base, want, "fp16 column average")


def case_noncontiguous_bcast_and_reduce():
    n, r = world(), rank()
    for root in range(n):
        base = torch.arange(24, dtype=torch.int32).reshape(4, 6) * 0 + r
        view = base[:, ::2]
        fm.bcast_(view, root_rank=root)
        want = torch.full((4, 6), r, dtype=torch.int32)
        want[:, ::2] = root
        check_equal(base, want, f"bcast_ strided, root {root}")

        base = torch.full((6, 4), r + 1, dtype=torch.float64)
        view = base.t()
        fm.reduce_(view, op="sum", root_rank=root)
        want = torch.full(
            (6, 4), float(n * (n + 1) // 2 if r == root else r + 1), dtype=torch.float64
        )
        check_equal(base, want, f"reduce_ transposed, root {root}")


def case_zero_dim_and_requires_grad():
    n, r = world(), rank()
    t = torch.tensor(float(r + 1))  # a 0-d tensor: one element
    fm.allreduce_(t)
    assert t.item() == n * (n + 1) / 2
    p = torch.nn.Parameter(torch.full((3,), float(r + 1)))  # a leaf that requires grad
    v0 = p._version
    fm.allreduce_(p, op="average")
    assert p.requires_grad and p._version > v0, "in-place write must bump the version counter"
    check_equal(p.detach(), torch.full((3,), (n + 1) / 2), "parameter average")
    q = torch.nn.Parameter(torch.full((3, 2), float(r + 1)))
    fm.bcast_(q.t(), root_rank=0)  # non-contiguous view of a leaf requiring grad
    check_equal(q.detach(), torch.full((3, 2), 1.0), "bcast_ into a parameter view")


# ---------------------------------------------------------------- 16-bit accumulation


def case_half_average_does_not_overflow():
    n = world()
    for t in (torch.full((9,), 40000.0, dtype=torch.float16),):
        fm.allreduce_(t, op="average")
        check_equal(t, torch.full((9,), 40000.0, dtype=torch.float16), "fp16 average of 40000")
    t = torch.full((9,), 40000.0, dtype=torch.float16)
    fm.reduce_(t, op="average", root_rank=n - 1)
    if rank() == n - 1:
        check_equal(t, torch.full((9,), 40000.0, dtype=torch.float16), "fp16 reduce_ average")
    t = torch.full((9,), 40000.0, dtype=torch.float16)
    fm.Iallreduce(t, op="average").wait()
    check_equal(t, torch.full((9,), 40000.0, dtype=torch.float16), "fp16 Iallreduce average")


def case_half_sum_rounds_once():
    # Rank 0 holds 2048 (fp16) / 256 (bf16), every other rank 1: the fp32 sum rounded once.
    # Rounding after each pairwise add would lose every +1 (2048 + 1 is a tie that rounds
    # back to 2048); with 4 ranks the two results differ (2052 against 2048 or 2050).
    n, r = world(), rank()
    for dtype, big in ((torch.float16, 2048.0), (torch.bfloat16, 256.0)):
        t = torch.full((5,), big if r == 0 else 1.0, dtype=dtype)
        fm.allreduce_(t)
        want = torch.full((5,), big + (n - 1), dtype=torch.float32).to(dtype)
        check_equal(t, want, f"{dtype} sum rounded once")
        t = torch.full((5,), big if r == 0 else 1.0, dtype=dtype)
        fm.reduce_(t, root_rank=0)
        if r == 0:
            check_equal(t, want, f"{dtype} reduce_ sum rounded once")
    if n == 4:
        assert torch.tensor(2051.0).half().item() == 2052.0


def case_integer_average_is_floor_without_wrap():
    n, r = world(), rank()
    t = torch.full((3,), 100 + r, dtype=torch.int8)  # int8 sum would wrap at 4 ranks
    fm.allreduce_(t, op="average")
    check_equal(
        t, torch.full((3,), (sum(100 + k for k in range(n))) // n, dtype=torch.int8), "int8 avg"
    )
    t = torch.full((3,), -1 - r, dtype=torch.int32)
    fm.allreduce_(t, op="average")
    check_equal(
        t,
        torch.full((3,), sum(-1 - k for k in range(n)) // n, dtype=torch.int32),
        "floor of negative mean",
    )


# ---------------------------------------------------------------- async


def case_iallreduce_ibcast_wait_and_test():
    n, r = world(), rank()
    t = torch.full((11,), float(r + 1))
    req = fm.Iallreduce(t)
    assert isinstance(req, fm.Request)
    out = req.wait()
    assert out is t and req.test()
    check_equal(t, torch.full((11,), n * (n + 1) / 2), "Iallreduce")
    assert req.wait() is t  # waiting again is fine
    assert "done=True" in repr(req)
    t = torch.full((4, 3), float(r)).t()
    fm.Ibcast(t, root_rank=n - 1).wait()
    check_equal(t, torch.full((3, 4), float(n - 1)), "Ibcast non-contiguous")


def case_outstanding_requests_complete_in_order():
    n, r = world(), rank()
    for _ in range(3):
        tensors = [torch.full((1000 * (k + 1),), float(r + k)) for k in range(6)]
        reqs = []
        for k, t in enumerate(tensors):
            reqs.append(fm.Ibcast(t, root_rank=k % n) if k % 3 == 2 else fm.Iallreduce(t, op="sum"))
        # Read done-flags newest first: once a later request is seen done, every earlier one
        # must already be done, or the engine ran them out of order.
        while True:
            flags = [q.test() for q in reversed(reqs)][::-1]
            assert flags == sorted(flags, reverse=True), f"out of order: {flags}"
            if all(flags):
                break
        for q in reversed(reqs):
            q.wait()
        for k, t in enumerate(tensors):
            if k % 3 == 2:
                want = torch.full_like(t, float(k % n + k))
            else:
                want = torch.full_like(t, float(sum(q + k for q in range(n))))
            check_equal(t, want, f"request {k}")


def case_blocking_call_waits_for_earlier_requests():
    n, r = world(), rank()
    a = torch.full((50_000,), float(r + 1))
    req = fm.Iallreduce(a)
    b = torch.full((3,), float(r + 1))
    fm.allreduce_(b)  # issued after the request: runs only once the request has finished
    assert req.test(), "a blocking collective overtook an earlier request"
    check_equal(a, torch.full((50_000,), n * (n + 1) / 2), "earlier request")
    check_equal(b, torch.full((3,), n * (n + 1) / 2), "blocking call")


def case_async_errors_raise_at_wait():
    n = world()
    req = fm.Iallreduce(torch.ones(3), op="median")
    try:
        req.wait()
    except ValueError as e:
        assert "median" in str(e) and "rank" in str(e), str(e)
    else:
        raise AssertionError("Iallreduce(op='median').wait() did not raise")
    assert req.test()
    req = fm.Ibcast(torch.ones(3), root_rank=n)
    try:
        req.wait()
    except ValueError as e:
        assert f"root_rank {n} is out of range" in str(e), str(e)
    else:
        raise AssertionError("Ibcast(root_rank=n).wait() did not raise")


# ---------------------------------------------------------------- bad input


def case_complex_allreduce_bcast_reduce_as_pairs():
    n, r = world(), rank()
    for dtype in (torch.complex64, torch.complex128):
        t = torch.tensor([1 + 2j, -3j], dtype=dtype) * (r + 1)
        check_equal(fm.allreduce_(t.clone()), t / (r + 1) * (n * (n + 1) / 2), f"sum {dtype}")
        got = fm.allreduce_(t.clone(), "average")
        torch.testing.assert_close(got, t / (r + 1) * ((n + 1) / 2))
        check_equal(fm.bcast_(t.clone(), root_rank=n - 1), t / (r + 1) * n, f"bcast {dtype}")
        got = fm.reduce_(t.clone(), root_rank=0)
        if r == 0:
            check_equal(got, t * (n * (n + 1) / 2), f"reduce {dtype}")
        check_equal(fm.Iallreduce(t.clone()).wait(), t / (r + 1) * (n * (n + 1) / 2), "async")
        # grouped, with real tensors of the pairs' dtype between them and a 0-dim one
        real = torch.arange(3.0, dtype=torch.float64) * (r + 1)
        zero_dim = torch.tensor(2 - 1j, dtype=dtype) * (r + 1)
        group = [t.clone(), real.clone(), zero_dim.clone()]
        fm.grouped_allreduce_(group, op="sum")
        check_equal(group[0], t / (r + 1) * (n * (n + 1) / 2), f"grouped {dtype}")
        check_equal(group[1], real / (r + 1) * (n * (n + 1) / 2), "grouped real")
        check_equal(group[2], zero_dim / (r + 1) * (n * (n + 1) / 2), "grouped 0-dim")
        group = [t.clone(), real.clone()]
        fm.grouped_allreduce_(group, op="average")
        torch.testing.assert_close(group[0], t / (r + 1) * ((n + 1) / 2))
    # non-contiguous: the real view writes through
    base = torch.ones(4, 4, dtype=torch.complex64)
    fm.allreduce_(base[:, 1])
    assert base[:, 1].eq(n).all() and base[:, 0].eq(1).all(), base
    if n > 1:
        # a complex tensor on one rank and its pairs as reals on another: ranks disagree
        t = torch.ones(3, dtype=torch.complex64) if r == 0 else torch.ones(3, 2)
        raises(RuntimeError, lambda: fm.allreduce_(t), "dtype", "torch.complex64")
        raises(RuntimeError, lambda: fm.grouped_allreduce_([t]), "dtype", "torch.complex64")


def case_bad_input_raises_on_every_rank():
    n, r = world(), rank()
    raises(
        TypeError,
        lambda: fm.allreduce_(torch.ones(3, dtype=torch.uint32)),
        "rank 0",
        "torch.uint32",
        "not supported",
    )
    # complex values reduce as pairs of reals only where that is right: sum and average
    raises(
        TypeError,
        lambda: fm.allreduce_(torch.ones(3, dtype=torch.complex64), op="max"),
        "rank 0",
        "torch.complex64",
        "not supported",
        "op 'sum' or 'average' only",
    )
    raises(
        TypeError,
        lambda: fm.grouped_allreduce_([torch.ones(2), torch.ones(3, dtype=torch.complex64)], "min"),
        "rank 0",
        "tensor 1",
        "op 'sum' or 'average' only",
    )
    raises(TypeError, lambda: fm.allreduce_(torch.ones(2, dtype=torch.complex64).conj()),
           "resolve_conj()")  # fmt: skip
    raises(TypeError, lambda: fm.bcast_(torch.ones(2, 2).to_sparse()), "layout", "rank 0")
    raises(
        ValueError, lambda: fm.allreduce_(torch.ones(3), op="median"), "'median'", "sum, average"
    )
    raises(ValueError, lambda: fm.reduce_(torch.ones(3), op="avg!", root_rank=0), "'avg!'")
    for bad_root in (n, -1):
        raises(
            ValueError,
            functools.partial(fm.bcast_, torch.ones(3), root_rank=bad_root),
            f"root_rank {bad_root} is out of range",
            f"< {n}",
        )
        raises(
            ValueError,
            functools.partial(fm.reduce_, torch.ones(3), root_rank=bad_root),
            f"root_rank {bad_root} is out of range",
        )
    raises(TypeError, lambda: fm.bcast_(torch.ones(3), root_rank="0"), "root_rank must be an int")
    raises(TypeError, lambda: fm.allreduce_([1.0, 2.0]), "must be a torch.Tensor, got list")
    raises(ValueError, lambda: fm.allreduce_(torch.zeros(1).expand(4)), "share memory")
    # a tensor left as it was by a failed call
    t = torch.full((3,), float(r))
    raises(ValueError, lambda: fm.allreduce_(t, op="nope"))
    check_equal(t, torch.full((3,), float(r)), "untouched after an error")


def case_bad_input_on_one_rank_only():
    n, r = world(), rank()
    bad = n - 1
    t = torch.ones(3, dtype=torch.uint32) if r == bad else torch.ones(3)
    raises(TypeError, lambda: fm.allreduce_(t), f"rank {bad}", "torch.uint32")
    t = [1] if r == bad else torch.ones(3)
    raises(TypeError, lambda: fm.bcast_(t), f"rank {bad}", "got list")
    op = "bogus" if r == bad else "sum"
    raises(ValueError, lambda: fm.reduce_(torch.ones(3), op=op), f"rank {bad}", "'bogus'")
    root = 99 if r == bad else 0
    raises(
        ValueError, lambda: fm.bcast_(torch.ones(3), root_rank=root), f"rank {bad}", "root_rank 99"
    )


def case_mismatch_across_ranks():
    n, r = world(), rank()
    if n == 1:
        return
    raises(
        RuntimeError,
        lambda: fm.allreduce_(torch.ones(r + 1)),
        "disagree on numel",
        "rank 0 has 1",
        "rank 1 has 2",
    )
    dt = torch.float32 if r == 0 else torch.float64
    raises(
        RuntimeError,
        lambda: fm.allreduce_(torch.ones(4, dtype=dt)),
        "disagree on dtype",
        "rank 0 has torch.float32",
        "rank 1 has torch.float64",
    )
    shape = (2, 3) if r == 0 else (3, 2)
    raises(
        RuntimeError, lambda: fm.bcast_(torch.ones(shape)), "disagree on shape", "[2, 3]", "[3, 2]"
    )
    op = "sum" if r == 0 else "max"
    raises(
        RuntimeError,
        lambda: fm.allreduce_(torch.ones(3), op=op),
        "disagree on op",
        "rank 1 has max",
    )
    raises(
        RuntimeError,
        lambda: fm.bcast_(torch.ones(3), root_rank=r % 2),
        "disagree on root_rank",
        "rank 0 has 0",
        "rank 1 has 1",
    )
    # different collectives at the same point
    call = (lambda: fm.bcast_(torch.ones(3))) if r == 0 else (lambda: fm.allreduce_(torch.ones(3)))
    raises(
        RuntimeError,
        call,
        "ranks are in different calls",
        "rank 0 is in bcast_()",
        "rank 1 is in allreduce_()",
    )
    req = fm.Iallreduce(torch.ones(r + 2))
    raises(RuntimeError, req.wait, "disagree on numel")
    # and the ranks are still in step afterwards
    t = torch.full((2,), float(r + 1))
    fm.allreduce_(t)
    check_equal(t, torch.full((2,), n * (n + 1) / 2), "after mismatches")


def case_small_calls_carry_their_data():
    """A loop of small calls of one size rides in the agreement's message (ops/carried.h) from
    its second call on, with the bits of the first (which moved its data after the check); a
    mismatch or a bad argument after such a loop still raises on every rank and leaves every
    tensor as it was."""
    n, r = world(), rank()
    if n == 1:
        return
    g = torch.Generator().manual_seed(r)
    x = torch.randn(1000, generator=g) * 1e3 ** torch.rand(1000, generator=g)
    ints = (x * 100).to(torch.int64)
    calls = [  # (call, input, carried at this world size)
        (lambda t: fm.allreduce_(t), x, n == 2),  # floats: the same bits on 2 ranks only
        (lambda t: fm.allreduce_(t, op="average"), x.double(), n == 2),
        (lambda t: fm.allreduce_(t, op="max"), ints, True),
        (lambda t: fm.allreduce_(t, op="average"), ints.to(torch.int16), True),
        (lambda t: fm.allreduce_(t, op="bxor"), ints.to(torch.int32), True),
        (lambda t: fm.allreduce_(t, op="sum"), ints > 0, True),
        (lambda t: fm.bcast_(t, root_rank=n - 1), x, True),
        (lambda t: fm.bcast_(t, root_rank=0), x.half().view(10, 100).t(), True),
        (lambda t: fm.reduce_(t, op="sum", root_rank=n - 1), x, n == 2),
        (lambda t: fm.reduce_(t, op="min", root_rank=0), ints.to(torch.int8), True),
    ]
    for call, given, carries in calls:
        fm.barrier()  # no room: the first call moves its data after its check
        first = call(given.clone())
        before = C.carried_calls()
        again = [call(given.clone()) for _ in range(3)]
        carried = C.carried_calls() - before
        assert carried == (3 if carries else 0), (carried, carries, given.dtype)
        for t in again:
            assert torch.equal(t, first) and t.stride() == first.stride(), "carried bits differ"
    # After a loop of one size, a mismatch raises on every rank, the tensors untouched.
    bad = [
        (lambda t: fm.allreduce_(t if r == 0 else t[:-1]), RuntimeError, "disagree on numel"),
        (lambda t: fm.allreduce_(t, op="sum" if r == 0 else "prod"), RuntimeError, "on op"),
        (lambda t: fm.bcast_(t, root_rank=r % 2), RuntimeError, "disagree on root_rank"),
        (lambda t: fm.reduce_(t, "max", 0 if r == 0 else n), ValueError, "out of range"),
        (lambda t: fm.allreduce_(t if r == 0 else t.int()), RuntimeError, "disagree on dtype"),
        (lambda t: fm.allreduce_(t, name="a" if r == 0 else "b"), RuntimeError, "different"),
    ]
    for call, error, text in bad:
        for _ in range(2):
            fm.allreduce_(ints.clone(), op="max")
        t = ints.clone()
        before = C.carried_calls()
        raises(error, functools.partial(call, t), text)
        assert torch.equal(t, ints), f"a failed check changed the tensor ({text})"
        assert C.carried_calls() == before, text
    # and the ranks are still in step
    t = torch.full((2,), float(r + 1))
    fm.allreduce_(t)
    check_equal(t, torch.full((2,), n * (n + 1) / 2), "after carried mismatches")


# ---------------------------------------------------------------- runtime


def case_runtime_helpers():
    n, r = world(), rank()
    launched = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    assert n == launched, (n, launched)
    assert r == int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    assert fm.Initialized()
    fm.Init()  # idempotent
    assert fm.total_workers() == n and fm.local_rank() == r
    assert fm.node_local_rank() == r  # one node here
    info = fm.build_info()
    for key in (
        "torch",
        "compiled_torch",
        "mpi_library",
        "mpi_standard",
        "cuda",
        "compiled_with_cuda",
        "nccl",
        "cuda_mpi_enabled",
        "thread_multiple",
    ):
        assert key in info, key
    assert info["torch"] == torch.__version__
    assert info["thread_multiple"] is True
    fm.barrier()


def case_print_prefix_and_order():
    n, r = world(), rank()
    f = io.StringIO()
    fm.fluxmpi_print("a", 1, file=f)
    fm.fluxmpi_println("b", file=f)
    assert f.getvalue() == f"[{r} / {n}] a 1[{r} / {n}] b\n", repr(f.getvalue())
    f = io.StringIO()
    fm.fluxmpi_println("line", "from", r, file=f, ordered=True)
    if r == 0:
        assert f.getvalue() == "".join(f"[{k} / {n}] line from {k}\n" for k in range(n)), (
            f.getvalue()
        )
    else:
        assert f.getvalue() == ""
    if r == n - 1:
        fm.fluxmpi_println(f"only-rank-{r}-prints")  # not a collective: one rank alone
    fm.fluxmpi_println("ordered-stdout", r, ordered=True)


if __name__ == "__main__":
    run_cases(globals())
