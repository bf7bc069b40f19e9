"""Collectives at any world size: every dtype, op, root and size (0, 1, odd), against closed
forms; async requests; the runtime helpers (non-contiguous tensors and 16-bit accumulation:
collectives_layouts_worker.py; bad input on every rank: collectives_bad_input_worker.py).

Run by tests/test_collectives.py under mpiexec at 1, 2 and 4 ranks (and once without mpiexec).
"""

import io
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import only_at, run_cases  # noqa: E402

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


# ---------------------------------------------------------------- 16-bit accumulation


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
